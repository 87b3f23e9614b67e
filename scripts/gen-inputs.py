#!/usr/bin/env python3
"""Generate .env.example and docs/inputs.md from the one input description
(plugins/module_utils/_inputs.py). `--check` exits 1 when either file is out of date (a unit test runs it)."""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections"))

from ansible_collections.narwhal.deploy.plugins.module_utils._inputs import INPUTS, NODE_INPUTS  # noqa: E402


def env_example():
    out = ["# narwhal.deploy site inputs. Copy to .env (git-ignored) and fill in.",
           "# Generated from plugins/module_utils/_inputs.py by scripts/gen-inputs.py; docs/inputs.md explains",
           "# every variable. The process environment overrides this file.", ""]
    for spec in INPUTS:
        out.append("# %s" % spec["doc"])
        extra = "required" if spec.get("required") else "default: %s" % spec.get("default")
        if spec.get("choices"):
            extra += "; one of %s" % ", ".join(spec["choices"])
        out.append("# (%s)" % extra)
        out.append("%s=%s" % (spec["name"], spec["example"]))
        out.append("")
    out.append("# Per engine: engine-<n> in the inventory is node <n>. The two-engine minimum:")
    for spec in NODE_INPUTS:
        out.append("# NARWHAL_NODE_<n>_%s: %s" % (spec["name"], spec["doc"]))
        example = spec.get("example")
        if isinstance(example, list):
            for n, value in enumerate(example, 1):
                out.append("NARWHAL_NODE_%d_%s=%s" % (n, spec["name"], value))
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def docs():
    out = ["# Site inputs (`.env`)", "",
           "Generated from `plugins/module_utils/_inputs.py` (`make docs`); validation reads the same description.",
           "The controller reads `.env` at the checkout root (or `$NARWHAL_ENV_FILE`) with python-dotenv;",
           "`NARWHAL_*` variables of the process environment override it. Every bad value stops discovery with",
           "an error naming the variable, before anything is written.", "",
           "| variable | kind | default | meaning |", "|---|---|---|---|"]
    for spec in INPUTS:
        kind = spec["kind"] + (" (%s)" % "/".join(spec["choices"]) if spec.get("choices") else "")
        default = "required" if spec.get("required") else "`%s`" % spec.get("default")
        out.append("| `%s` | %s | %s | %s |" % (spec["name"], kind, default, spec["doc"]))
    out += ["", "## Per node", "", "`<n>` is the number of the inventory host `engine-<n>`.", "",
            "| variable | kind | meaning |", "|---|---|---|"]
    for spec in NODE_INPUTS:
        out.append("| `NARWHAL_NODE_<n>_%s` | %s | %s |" % (spec["name"], spec["kind"], spec["doc"]))
    return "\n".join(out) + "\n"


def main():
    targets = {ROOT / ".env.example": env_example(), ROOT / "docs" / "inputs.md": docs()}
    stale = [p for p, text in targets.items() if not p.exists() or p.read_text() != text]
    if "--check" in sys.argv:
        for p in stale:
            print("%s is out of date: run make docs" % p.relative_to(ROOT))
        return 1 if stale else 0
    for p in stale:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(targets[p])
        print("wrote %s" % p.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
