"""Stand-in of vllm.config.kv_events.KVEventsConfig (vLLM 0.32.0): the fields, their defaults and the refusals of the
real class, a pydantic dataclass made by vllm/config/utils.py::config with extra="forbid". Read from the real class
(the narwhal-sim/vllm-cpu image): an unknown field is "Unexpected keyword argument", a publisher other than
"null"/"zmq" a literal_error, a value of the wrong type int_parsing / string_type / bool_parsing (pydantic's lax mode:
"true"/"yes"/"1"... are a bool, a string of digits an int); __post_init__ sets the publisher to "zmq" when events are
enabled and none was named, else "null". The messages are pydantic's first lines (without its documentation link)."""

# field -> (kind, default), in the class's order (dataclasses.asdict keeps it: /kv_event_sources writes it so)
FIELDS = {"enable_kv_cache_events": ("bool", False), "publisher": ("publisher", None),
          "endpoint": ("str", "tcp://*:5557"), "replay_endpoint": ("optional_str", None),
          "buffer_steps": ("int", 10_000), "hwm": ("int", 100_000), "max_queue_size": ("int", 100_000),
          "topic": ("str", "")}
_TRUE = ("1", "on", "t", "true", "y", "yes")
_FALSE = ("0", "off", "f", "false", "n", "no")


class ValidationError(ValueError):
    pass


def _refuse(field, message, kind, value):
    raise ValidationError(f"1 validation error for KVEventsConfig\n{field}\n  {message} [type={kind}, "
                          f"input_value={value!r}, input_type={type(value).__name__}]")


def _convert(field, kind, value):
    """One field's value as pydantic's lax mode takes it, or ValidationError."""
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        if isinstance(value, (str, int)):
            _refuse(field, "Input should be a valid boolean, unable to interpret input", "bool_parsing", value)
        _refuse(field, "Input should be a valid boolean", "bool_type", value)
    if kind == "int":
        if isinstance(value, int):
            return int(value)  # a bool too: True is 1
        if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
            return int(value)
        if isinstance(value, float):
            if value.is_integer():
                return int(value)
            _refuse(field, "Input should be a valid integer, got a number with a fractional part", "int_from_float",
                    value)
        _refuse(field, "Input should be a valid integer" + (", unable to parse string as an integer"
                                                            if isinstance(value, str) else ""),
                "int_parsing" if isinstance(value, str) else "int_type", value)
    if kind == "publisher":
        if value in ("null", "zmq"):
            return value
        _refuse(field, "Input should be 'null' or 'zmq'", "literal_error", value)
    if kind == "optional_str" and value is None:
        return None
    if isinstance(value, str):
        return value
    _refuse(field, "Input should be a valid string", "string_type", value)
    return None  # not reached


class KVEventsConfig:
    """--kv-events-config: KVEventsConfig(**json) as vLLM builds it (ValidationError as the real class refuses)."""

    def __init__(self, **kwargs):
        for field, value in kwargs.items():
            if field not in FIELDS:
                _refuse(field, "Unexpected keyword argument", "unexpected_keyword_argument", value)
        for field, (kind, default) in FIELDS.items():
            setattr(self, field, _convert(field, kind, kwargs[field]) if field in kwargs else default)
        # __post_init__ (an explicit null "publisher" was refused above: the field's type is a Literal)
        if self.publisher is None:
            self.publisher = "zmq" if self.enable_kv_cache_events else "null"

    def asdict(self):
        """dataclasses.asdict of the config: how /kv_event_sources writes it (FastAPI's jsonable_encoder)."""
        return {field: getattr(self, field) for field in FIELDS}
