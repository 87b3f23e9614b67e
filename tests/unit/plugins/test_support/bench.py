# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The benchmark plan's engine lengths as the role reads them (the narwhal.deploy.probe_engines lookup's
max_model_len and max_model_len_from, plugins/lookup/probe_engines.py)."""


def lengths(fleet, limit=4096, **limits):
    """{"max_model_len": {engine: limit}, "max_model_len_from": {engine: where}} of every engine of `fleet`; `limits`
    (engine names with _ for -) override one engine's (None: unknown)."""
    out = {"max_model_len": {}, "max_model_len_from": {}}
    for entry in fleet:
        value = limits.get(entry["engine"].replace("-", "_"), limit)
        out["max_model_len"][entry["engine"]] = value
        missing = "no --max-model-len in the record and no length in the checkpoint's config"
        out["max_model_len_from"][entry["engine"]] = "--max-model-len in the record" if value else missing
    return out
