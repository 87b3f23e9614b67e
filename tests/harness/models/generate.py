"""Generate the real-engine scenario's tiny checkpoints (no model hub): a Llama-style model with random
bfloat16 weights and a byte-level BPE tokenizer trained locally whose vocabulary equals the model's.

Runs with the real engine image's own Python (torch, transformers, tokenizers, safetensors), called by
scripts/build-images.sh (real_models):  python generate.py OUT_DIR

Writes two checkpoints, exactly as an operator's would look on disk:
  OUT_DIR/tiny-llama-real/     config.json, model.safetensors, generation_config.json, tokenizer.json,
                               tokenizer_config.json, special_tokens_map.json
  OUT_DIR/tiny-llama-remote/   the same model whose tokenizer ships its own code: tokenizer_config.json
                               carries an ``auto_map`` to tokenization_narwhal.py, so loading it needs
                               --trust-remote-code (transformers refuses it otherwise).

Geometry (docs/real-engine.md, "The checkpoints"): hidden 128, 2 layers, 4 heads, 2 KV heads -> head_dim 32 (the CPU
attention backend supports 32, 64, 80, ...; 16 kills the engine on the first request), vocabulary 512.
Deterministic: fixed seed and corpus.
"""
import json
import os
import shutil
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB = 512
SPECIAL = ["<unk>", "<s>", "</s>"]
WORDS = ("prefill decode engine cache block transfer fabric address narwhal tensor parallel model token "
         "prompt request server connector nixl ucx layer head attention value key memory host device "
         "the a of to in and is for on with as by at from that this it be are was").split()

REMOTE_CODE = '''"""Custom tokenizer code shipped with the checkpoint (narwhal.deploy test model): loading it needs
trust_remote_code=True, the way checkpoints with their own tokenizer class do."""
from transformers import PreTrainedTokenizerFast


class NarwhalTokenizerFast(PreTrainedTokenizerFast):
    """A fast BPE tokenizer under its own class name."""
'''


def corpus():
    """A fixed, varied English-like corpus (lines of the word list in many orders plus digits)."""
    lines = []
    for i in range(4000):
        words = [WORDS[(i * 7 + j * 13 + (i // 5) * j) % len(WORDS)] for j in range(6 + i % 9)]
        lines.append(" ".join(words) + " %d." % (i % 97))
    lines.append("The quick brown fox jumps over the lazy dog 0123456789 !?,;:'\"()[]{}<>-_=+*/\\|@#$%^&~`")
    return lines


CHAT_TEMPLATE = ("{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def tokenizer():
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   model_max_length=256)
    # A chat template, as chat models ship one: vLLM's /v1/chat/completions refuses a tokenizer without one
    # (transformers no longer has a default template), and the router is proven with chat requests too.
    fast.chat_template = CHAT_TEMPLATE
    return fast


def model():
    torch.manual_seed(20261130)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                         rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
                         torch_dtype="bfloat16")
    net = LlamaForCausalLM(config).to(torch.bfloat16)
    # Larger random weights than the default init: greedy outputs then depend visibly on the prompt.
    with torch.no_grad():
        for p in net.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
    return net


def main(out):
    tok, net = tokenizer(), model()
    plain = os.path.join(out, "tiny-llama-real")
    remote = os.path.join(out, "tiny-llama-remote")
    for path in (plain, remote):
        shutil.rmtree(path, ignore_errors=True)
        net.save_pretrained(path, safe_serialization=True)
        tok.save_pretrained(path)
    with open(os.path.join(remote, "tokenization_narwhal.py"), "w", encoding="utf-8") as fh:
        fh.write(REMOTE_CODE)
    tc_path = os.path.join(remote, "tokenizer_config.json")
    with open(tc_path, encoding="utf-8") as fh:
        tc = json.load(fh)
    tc["tokenizer_class"] = "NarwhalTokenizerFast"
    tc["auto_map"] = {"AutoTokenizer": [None, "tokenization_narwhal.NarwhalTokenizerFast"]}
    with open(tc_path, "w", encoding="utf-8") as fh:
        json.dump(tc, fh, indent=2, sort_keys=True)
        fh.write("\n")
    for path in (plain, remote):
        with open(os.path.join(path, "config.json"), encoding="utf-8") as fh:
            cfg = json.load(fh)
        print("%s: %s head_dim=%d dtype=%s vocab=%d" % (path, cfg["architectures"][0], cfg["head_dim"],
                                                        cfg.get("torch_dtype") or cfg.get("dtype"), cfg["vocab_size"]))


if __name__ == "__main__":
    main(sys.argv[1])
