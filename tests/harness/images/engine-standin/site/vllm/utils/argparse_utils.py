"""Stand-in of vllm.utils.argparse_utils (narwhal.deploy test harness): FlexibleArgumentParser in the parts that
parsing a `vllm serve` argv touches, as vLLM 0.32 has them: `--x_y` read as `--x-y`, `-O3`/`-O 3` read as
`--optimization-level 3`, dotted JSON arguments (`--json-arg.key value`, `--json-arg.key+ a,b`) merged into one
JSON value, and argparse's prefix abbreviations left on (vLLM does not turn them off: `--max-model` is
`--max-model-len`, an ambiguous prefix is an error). Not modelled: `--config` files, `--model` moved to the
front, `--help=<group>`, the `--task` hint, deprecation warnings."""
import argparse
import json
import re
import sys


def human_readable_int(value):
    """'1k' -> 1000, '1K' -> 1024, '25.6k' -> 25600, '64M' -> 67108864, or a plain integer (vLLM's rules)."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if match:
        number, suffix = match.groups()
        decimal = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
        if suffix in decimal:
            return int(float(number) * decimal[suffix])
        try:
            return int(number) * {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[suffix]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}. Did you mean to use "
                f"{number}{suffix.lower()} instead?") from exc
    return int(value)


def human_readable_int_or_auto(value):
    value = value.strip()
    if value == "-1" or value.lower() == "auto":
        return -1
    return human_readable_int(value)


def _dash(match):
    return match.group(0).replace("_", "-")


def _nested(keys, value):
    for key in reversed(keys):
        value = {key: value}
    return value


def _merge(original, update):
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(original.get(key), dict):
            _merge(original[key], value)
        elif isinstance(value, list) and isinstance(original.get(key), list):
            original[key] += value
        else:
            original[key] = value


class FlexibleArgumentParser(argparse.ArgumentParser):
    """ArgumentParser that allows both underscore and dash in names."""

    def parse_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        name = re.compile(r"(?<=--)[^\.]*")  # everything between the first -- and the first .
        processed = []
        for index, arg in enumerate(args):
            if arg.startswith("--"):
                if "=" in arg:
                    key, value = arg.split("=", 1)
                    processed.append("%s=%s" % (name.sub(_dash, key, count=1), value))
                else:
                    processed.append(name.sub(_dash, arg, count=1))
            elif arg.startswith("-O") and arg != "-O":
                processed += ["--optimization-level", arg[3:] if arg[2] == "=" else arg[2:]]
            elif arg == "-O" and index + 1 < len(args) and args[index + 1] in {"0", "1", "2", "3"}:
                processed.append("--optimization-level")
            else:
                processed.append(arg)
        delete, dict_args = set(), {}
        for index, arg in enumerate(processed):
            if index in delete or not arg.startswith("-") or "." not in arg:
                continue
            if arg.startswith("--") and "." not in arg.split("=", 1)[0]:
                continue  # a '.' only in the value
            if "=" in arg:
                arg, value_str = arg.split("=", 1)
            else:
                value_str = processed[index + 1]
                delete.add(index + 1)
            if arg.endswith("+"):
                arg = arg[:-1]
                value_str = json.dumps(value_str.split(","))
            key, *keys = arg.split(".")
            try:
                value = json.loads(value_str)
            except ValueError:
                try:
                    value = human_readable_int(value_str)
                except (ValueError, argparse.ArgumentTypeError):
                    value = value_str
            _merge(dict_args.setdefault(key, {}), _nested(keys, value))
            delete.add(index)
        processed = [a for i, a in enumerate(processed) if i not in delete]
        for key, value in dict_args.items():
            processed += [key, json.dumps(value)]
        return super().parse_args(processed, namespace)
