"""STAND-IN for Hugging Face `transformers` (narwhal.deploy test harness) -- NOT the real library.

Only what the launcher's image check calls: ``AutoTokenizer.from_pretrained(path, trust_remote_code=False)``.
It reads ``tokenizer.json`` / ``tokenizer_config.json`` from a local checkpoint directory and refuses the way
real transformers does: OSError when no tokenizer file is there or a file is not valid JSON, ValueError naming
``trust_remote_code`` when ``tokenizer_config.json`` has an ``auto_map`` and remote code is not trusted.
"""
import json
import os

__version__ = "5.20.0"
__all__ = ["AutoTokenizer", "PreTrainedTokenizerFast", "__version__"]


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except ValueError as exc:
        raise OSError("Unable to load %s: it is not valid JSON (%s)" % (path, exc)) from exc


class PreTrainedTokenizerFast:
    """Holds the checkpoint's tokenizer files as read (no tokenization in the stand-in)."""

    def __init__(self, name_or_path, tokenizer=None, config=None):
        self.name_or_path = name_or_path
        self.backend = tokenizer or {}
        self.init_kwargs = config or {}
        model = self.backend.get("model") if isinstance(self.backend, dict) else None
        vocab = model.get("vocab") if isinstance(model, dict) else None
        self.vocab_size = len(vocab) if isinstance(vocab, (dict, list)) else 0

    def __repr__(self):
        return "PreTrainedTokenizerFast(name_or_path=%r, vocab_size=%d)" % (self.name_or_path, self.vocab_size)


class AutoTokenizer:
    def __init__(self):
        raise OSError("AutoTokenizer is designed to be instantiated using "
                      "`AutoTokenizer.from_pretrained(pretrained_model_name_or_path)`.")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, trust_remote_code=False, **kwargs):
        path = str(pretrained_model_name_or_path)
        tok_file = os.path.join(path, "tokenizer.json")
        cfg_file = os.path.join(path, "tokenizer_config.json")
        has_tok, has_cfg = os.path.isfile(tok_file), os.path.isfile(cfg_file)
        if not has_tok and not has_cfg:
            raise OSError("Can't load tokenizer for '%s'. If you were trying to load it from "
                          "'https://huggingface.co/models', make sure you don't have a local directory with the "
                          "same name. Otherwise, make sure '%s' is the correct path to a directory containing all "
                          "relevant files for a PreTrainedTokenizerFast tokenizer." % (path, path))
        config = _read_json(cfg_file) if has_cfg else {}
        if not isinstance(config, dict):
            raise OSError("Unable to load %s: expected a JSON object" % cfg_file)
        if config.get("auto_map") and not trust_remote_code:
            raise ValueError(
                "The repository %s contains custom code which must be executed to correctly load the model. "
                "You can inspect the repository content at %s.\nPlease pass the argument "
                "`trust_remote_code=True` to allow custom code to be run." % (path, path))
        tokenizer = _read_json(tok_file) if has_tok else {}
        return PreTrainedTokenizerFast(path, tokenizer, config)
