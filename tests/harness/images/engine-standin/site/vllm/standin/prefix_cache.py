"""Stand-in of vLLM 0.32.0's automatic prefix cache (narwhal.deploy test harness): one per engine core (DP rank).

What it replays, read from the vLLM 0.32.0 source (the narwhal-sim/vllm-cpu image):
- block hashes (v1/core/kv_cache_utils.py): a request's FULL blocks of --block-size tokens are hashed as a chain,
  hash_block_tokens(hash_fn, parent, tokens, extra_keys) = hash_fn((parent or NONE_HASH, tuple(tokens), None));
  get_request_block_hasher hashes full blocks only. hash_fn is --prefix-caching-hash-algo (vllm/utils/hashing.py,
  default sha256): sha256 = SHA-256 of pickle.dumps(input, protocol=pickle.HIGHEST_PROTOCOL), sha256_cbor = SHA-256
  of cbor2.dumps(input, canonical=True) (the stand-in writes that canonical CBOR itself: cbor()). xxhash and
  xxhash_cbor are not modelled (refused at start: algo_error). NONE_HASH = hash_fn(seed), the seed
  (resolve_none_hash_seed) PYTHONHASHSEED when set, else "vllm-none-hash" for these cryptographic algorithms, so
  engines with the same algorithm and PYTHONHASHSEED agree on every block's hash.
  tests/fixtures/recorded/vllm-0.32.0-kv-events holds hashes the real code computed; the unit tests compare.
- the lookup (v1/core/kv_cache_manager.py::get_computed_blocks): the longest run of the request's block hashes, from
  the first, that the cache holds, within num_tokens - 1 tokens (the last prompt token is always computed, to get
  logits); skipped when prefix caching is off (--no-enable-prefix-caching; vLLM's default is on).
- the stats (record_prefix_cache_stats, PrefixCacheStats.record): per looked-up request, queries += its prompt tokens,
  hits += its cached tokens (vllm:prefix_cache_queries / vllm:prefix_cache_hits); nothing without prefix caching.
- storing (v1/core/block_pool.py::cache_full_blocks): the request's full blocks after its hits get their hashes, one
  BlockStored event for them (parent: the hash of the block before the first new one, or None), token_ids the
  blocks' tokens, block_size, medium "GPU", group_idx 0 (the one KV cache group of a plain-attention model), the
  LoRA fields None; hashes as ExternalBlockHash (maybe_convert_block_hash: VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES,
  default 1, gives the low 64 bits of the hash as an int, big-endian; 0 gives the bytes).
- eviction (block_pool.py: a freed block goes to the free queue's tail, the blocks of a request in reverse order, and a
  new allocation takes the queue's head, dropping its hash: _maybe_evict_cached_block, one BlockRemoved per hash):
  least recently used first, at the cache's capacity in blocks (--num-gpu-blocks-override, else the stand-in's
  BLOCK_CAPACITY).
- reset (block_pool.py::reset_prefix_cache): refused while a request runs, else every hash dropped and one
  AllBlocksCleared event.
What it leaves out: the blocks are the hashes alone (the stand-in's KV payload is a function of the prompt); a block
leaves the cache only at capacity (vLLM also reuses free blocks for the partial blocks and generated tokens of running
requests); generated tokens' blocks are not cached (a prefill answers one token; the stand-in's generated token IDs
are not what its tokenizer gives their text); cache_salt, LoRA and multimodal extra keys are not modelled.
The caller holds the engine's lock around every method."""
import hashlib
import pickle
from collections import OrderedDict

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"  # kv_cache_utils.py DEFAULT_NONE_HASH_SEED
MODELLED_ALGOS = ("sha256", "sha256_cbor")
MEDIUM_GPU = "GPU"  # distributed/kv_events.py MEDIUM_GPU, the block pool's medium


def cbor(value):
    """cbor2.dumps(value, canonical=True) for what the block hashes feed it: str, bytes, ints >= 0, None, tuples and
    lists (RFC 8949 deterministic encoding: the shortest head for every length and integer)."""
    def head(major, n):
        if n < 24:
            return bytes([major << 5 | n])
        for extra, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
            if n < 1 << (8 * size):
                return bytes([major << 5 | extra]) + n.to_bytes(size, "big")
        raise ValueError("integer too large for this CBOR writer: %d" % n)

    if value is None:
        return b"\xf6"
    if isinstance(value, bool):
        return b"\xf5" if value else b"\xf4"
    if isinstance(value, int):
        if value < 0:
            return head(1, -1 - value)
        return head(0, value)
    if isinstance(value, bytes):
        return head(2, len(value)) + value
    if isinstance(value, str):
        data = value.encode("utf-8")
        return head(3, len(data)) + data
    if isinstance(value, (tuple, list)):
        return head(4, len(value)) + b"".join(cbor(v) for v in value)
    raise TypeError("no CBOR for %r" % type(value).__name__)


def hash_function(algo):
    """vllm/utils/hashing.py::get_hash_fn_by_name for the modelled algorithms."""
    if algo == "sha256":
        return lambda value: hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    if algo == "sha256_cbor":
        return lambda value: hashlib.sha256(cbor(value)).digest()
    raise ValueError("unmodelled hash algorithm %s" % algo)


def algo_error(args):
    """The start's refusal of an algorithm the stand-in does not model (None: fine); only with prefix caching on."""
    algo = getattr(args, "prefix_caching_hash_algo", None) or "sha256"
    if algo in MODELLED_ALGOS or not prefix_caching(args):
        return None
    return ("ERROR narwhal stand-in: --prefix-caching-hash-algo %s is not modelled (the stand-in hashes blocks as "
            "vLLM's %s do); pick one of them or --no-enable-prefix-caching" % (algo, " and ".join(MODELLED_ALGOS)))


def prefix_caching(args):
    """--enable-prefix-caching / --no-enable-prefix-caching; unset: on (vLLM 0.32.0 engine/arg_utils.py: the model's
    default, on for a generative model)."""
    value = getattr(args, "enable_prefix_caching", None)
    return True if value is None else bool(value)


def none_hash_seed(env):
    """kv_cache_utils.py::resolve_none_hash_seed for a cryptographic algorithm: PYTHONHASHSEED when set (even
    empty), else "vllm-none-hash"."""
    seed = env.get("PYTHONHASHSEED")
    return DEFAULT_NONE_HASH_SEED if seed is None else seed


def use_int_hashes(env):
    """vllm/envs.py VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES: bool(int(value)), default "1"."""
    return bool(int(env.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")))


class PrefixCache:
    """The prefix cache of one engine core: block hash -> None, least recently used first."""

    def __init__(self, block_size, capacity, algo="sha256", env=None, enabled=True):
        env = {} if env is None else env
        self.block_size, self.capacity, self.enabled = block_size, capacity, enabled
        self.hash_fn = hash_function(algo if algo in MODELLED_ALGOS else "sha256")
        self.none_hash = self.hash_fn(none_hash_seed(env))
        self.int_hashes = use_int_hashes(env)
        self.blocks = OrderedDict()

    def external(self, block_hash):
        """maybe_convert_block_hash: the hash as KV events carry it."""
        return int.from_bytes(block_hash, "big") & ((1 << 64) - 1) if self.int_hashes else block_hash

    def block_hashes(self, token_ids):
        """get_request_block_hasher: the chained hashes of the full blocks of `token_ids`."""
        out, parent, size = [], None, self.block_size
        for start in range(0, len(token_ids) - size + 1, size):
            parent = self.hash_fn((parent or self.none_hash, tuple(token_ids[start:start + size]), None))
            out.append(parent)
        return out

    def lookup(self, hashes, num_tokens):
        """-> the cached tokens of a request with these block hashes and `num_tokens` tokens (0 when off)."""
        if not self.enabled:
            return 0
        hit = 0
        for block_hash in hashes[:max(num_tokens - 1, 0) // self.block_size]:
            if block_hash not in self.blocks:
                break
            hit += 1
        return hit * self.block_size

    def store(self, hashes, token_ids, cached_tokens):
        """The request's full blocks enter the cache (the first cached_tokens // block_size were hits) -> the KV events
        (maps in the order msgspec writes the structs): one BlockStored for the new blocks, a BlockRemoved per
        evicted block."""
        if not self.enabled:
            return []
        events, hit, size = [], cached_tokens // self.block_size, self.block_size
        if len(hashes) > hit:
            events.append({"type": "BlockStored", "block_hashes": [self.external(h) for h in hashes[hit:]],
                           "parent_block_hash": self.external(hashes[hit - 1]) if hit else None,
                           "token_ids": list(token_ids[hit * size:len(hashes) * size]), "block_size": size,
                           "lora_id": None, "medium": MEDIUM_GPU, "lora_name": None, "group_idx": 0})
        for block_hash in reversed(hashes):  # freed in reverse: the first block is the last to go
            self.blocks[block_hash] = None
            self.blocks.move_to_end(block_hash)
        while len(self.blocks) > self.capacity:
            gone, _none = self.blocks.popitem(last=False)
            events.append({"type": "BlockRemoved", "block_hashes": [self.external(gone)], "medium": MEDIUM_GPU,
                           "group_idx": 0})
        return events

    def clear(self):
        """reset_prefix_cache (the caller checked that no request runs) -> [AllBlocksCleared] (when caching)."""
        self.blocks.clear()
        return [{"type": "AllBlocksCleared"}] if self.enabled else []
