"""Chat templates → tool-call wire format: which `grammars/<format>.lark` a model's template writes its calls in.

In: a chat template's Jinja source. Out: a format name of `constrain.grammar.FORMATS` (`detect_format`), and the
text a template renders for an assistant turn (`render_assistant_turn`, HF's Jinja environment, used by tests).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any, Sequence

# Detection renders one probe call through the template (as llama.cpp's autoparser diffs renderings) and looks for
# each format's exact spelling of that call in what the assistant turn became. A marker search on the template
# source alone misreads templates that merely mention a tag in their instructions (GLM's `<tool_call>NAME<arg_key>`,
# Laguna's prose about `<tool_call>` tags).
_PROBE_NAME, _PROBE_KEY, _PROBE_VALUE = "probe_fn", "probe_arg", "probe value"
_PROBE_TOOLS = [{"type": "function", "function": {
    "name": _PROBE_NAME, "description": "A probe.",
    "parameters": {"type": "object", "properties": {_PROBE_KEY: {"type": "string"}}, "required": [_PROBE_KEY]}}}]
_ARGS_JSON = '{"probe_arg": "probe value"}'

# (format, the call as that format writes it): first match wins, so a spelling that contains another comes first.
_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("qwen3_xml", re.compile(re.escape("<tool_call>\n<function=probe_fn>\n<parameter=probe_arg>\nprobe value\n"
                                       "</parameter>\n</function>\n</tool_call>"))),
    ("hermes", re.compile(re.escape('<tool_call>\n{"name": "probe_fn", "arguments": ' + _ARGS_JSON + "}\n</tool_call>"))),
    ("gemma4", re.compile(re.escape('<|tool_call>call:probe_fn{probe_arg:<|"|>probe value<|"|>}<tool_call|>'))),
    ("mistral", re.compile(re.escape("[TOOL_CALLS]probe_fn") + r"(?:\[CALL_ID\][A-Za-z0-9]{9})?"
                           + re.escape("[ARGS]" + _ARGS_JSON))),
    ("mistral_v3", re.compile(re.escape('[TOOL_CALLS][{"name": "probe_fn", "arguments": ' + _ARGS_JSON))),
    ("llama3_json", re.compile(re.escape('{"name": "probe_fn", "parameters": ' + _ARGS_JSON + "}<|eot_id|>"))),
)


class NoToolFormat(ValueError):
    """The template writes tool calls in none of the supported formats (or writes no tool calls at all)."""


def detect_format(template_text: str) -> str:
    """The tool-call wire format a chat template writes assistant tool calls in.

    Renders a conversation whose assistant turn calls one probe tool (HF's Jinja environment, see `render`) and
    finds which format's exact spelling of that call the turn contains.

    Args:
        template_text: the Jinja source of the chat template.
    Returns:
        One of the format names (`hermes`, `qwen3_xml`, `gemma4`, `llama3_json`, `mistral`, `mistral_v3`).
    Raises:
        NoToolFormat (a ValueError): the template renders no tool calls, fails on a tool-call turn, or writes
            them in no supported format; the message names what was found (the server answers 400 for
            `tool_choice` required/named with such a model).
    """
    if "tool_call" not in template_text:
        raise NoToolFormat("the chat template renders no tool calls (no `tool_call` in its source)")
    call = {"name": _PROBE_NAME, "arguments": {_PROBE_KEY: _PROBE_VALUE}}
    messages = [{"role": "user", "content": "Call the probe."}]
    try:
        # The whole conversation, not just the turn: templates that rewrite history (QwQ, DeepSeek R1 drop
        # thinking) have no prompt/turn split, and the probe call is spelled only in the assistant turn.
        turn = render(template_text, [*messages, assistant_message([call])], tools=_PROBE_TOOLS, bos_token="<s>",
                      eos_token="</s>")
    except Exception as err:  # any template failure: jinja2 errors, raise_exception, type errors inside the template
        raise NoToolFormat(f"the chat template fails on an assistant tool-call turn: {type(err).__name__}: {err}"
                           + _markers(template_text)) from err
    for name, shape in _SHAPES:
        if shape.search(turn):
            return name
    at = max(turn.rfind(_PROBE_NAME) - 80, 0)  # the assistant turn's call, not the system prompt's tool list
    shown = turn[at : at + 200]
    raise NoToolFormat(f"the chat template writes tool calls in no supported format: a call renders as {shown!r}"
                       + _markers(template_text))


def _markers(template_text: str) -> str:
    found = sorted({m for m in _HINTS if m in template_text})
    return f" (markers in the template: {', '.join(found)})" if found else ""


# Markers of other formats, named in the error so the caller sees what the template uses.
_HINTS = (
    "<tool_call>", "<|tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "<｜tool▁calls▁begin｜>",
    "<|tool_calls_section_begin|>", "<arg_key>", "<|channel|>", "to=functions.", "<|tool_call|>", "functools[",
    "<function_calls>", "<minimax:tool_call>", "<|START_ACTION|>", "<tool_calls>", "<｜DSML｜",
)


# ---------------------------------------------------------------------------
# rendering (HF transformers' chat-template environment, reproduced without importing transformers)
# ---------------------------------------------------------------------------


def _environment() -> Any:
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        # HF's override: no HTML escaping, non-ASCII kept raw (transformers chat_template_utils.py)
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    class Generation(jinja2.ext.Extension):
        # HF's `{% generation %}...{% endgeneration %}` (AssistantTracker) marks assistant text; rendering ignores it
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime(2026, 1, 1).strftime(fmt)  # fixed: renders reproducible
    return env


def render(template_text: str, messages: Sequence[dict], *, tools: Sequence[dict] | None = None,
           add_generation_prompt: bool = False, **kwargs: Any) -> str:
    """Render `messages` through a chat template as transformers' `apply_chat_template(tokenize=False)` does.

    Raises:
        jinja2.TemplateError: the template raised (e.g. `raise_exception("only one tool call")`).
    """
    template = _environment().from_string(template_text)
    context = {"bos_token": kwargs.pop("bos_token", ""), "eos_token": kwargs.pop("eos_token", "")}
    return template.render(messages=list(messages), tools=list(tools) if tools is not None else None,
                           add_generation_prompt=add_generation_prompt, **context, **kwargs)


# Empty thinking blocks a generation prompt may prefill (thinking off) that the template leaves out of history turns:
# Gemma 4 31B/26B (`<|channel>thought\n<channel|>`, reference/tool-call-formats.md §3).
_EMPTY_THINKING_PREFILLS = ("<|channel>thought\n<channel|>",)


def render_assistant_turn(template_text: str, messages: Sequence[dict], assistant: dict, *,
                          tools: Sequence[dict] | None = None, **kwargs: Any) -> str:
    """The text a template renders for `assistant` after `messages`, cut after the generation prompt.

    The prompt is `messages` rendered with `add_generation_prompt=True`; the full text is `messages + [assistant]`
    rendered without it, and must start with the prompt (less an empty thinking block the prompt prefills and history
    turns omit, as Gemma 4's does when thinking is off). What follows the prompt is what the model was trained to
    generate (the caller trims whatever the template appends after the turn's end token).

    Raises:
        ValueError: the full rendering does not extend the prompt (the template rewrites earlier turns).
    """
    prompt = render(template_text, messages, tools=tools, add_generation_prompt=True, **kwargs)
    full = render(template_text, [*messages, assistant], tools=tools, add_generation_prompt=False, **kwargs)
    for prefill in ("", *_EMPTY_THINKING_PREFILLS):
        if prompt.endswith(prefill) and full.startswith(prompt[: len(prompt) - len(prefill)]):
            # The prompt prefills an empty thinking block that history turns omit: the model writes what follows.
            return full[len(prompt) - len(prefill):]
    raise ValueError("the template's rendering of the assistant turn does not extend its generation prompt")


def assistant_message(calls: Sequence[dict], *, content: str = "") -> dict:
    """An OpenAI assistant message with `calls` ({"name", "arguments" (a dict)}) as `tool_calls`."""
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": f"call{i:05d}", "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for i, c in enumerate(calls)
        ],
    }


__all__ = ["NoToolFormat", "assistant_message", "detect_format", "render", "render_assistant_turn"]
