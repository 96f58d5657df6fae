"""Prompt rendering through the tokenizer's chat template, token by token, for multi-turn tool use.

A rollout's token stream is the opening prompt followed by alternating pieces: the model's own reply tokens
(loss mask 1, kept exactly as sampled, never re-tokenized) and the tokens the template and the environment add
between replies (mask 0): the end of the assistant turn, the tool results, the next user turn and the next
generation prompt. `ChatRenderer` produces those pieces.

Rendering rules
- The template is applied to whole message lists; the tokens between two replies are the *difference* between
  rendering the conversation up to an assistant message and rendering it with the new messages appended (plus the
  generation prompt). A template that is not prefix-stable under appending (it rewrites earlier turns) is
  refused with a clear error rather than silently misaligning masks.
- Tool schemas go to the template's `tools` argument when the template renders them (Qwen2.5/Qwen3, Llama 3.x);
  templates that ignore `tools` (SmolLM2's ChatML template does) get them in the system prompt instead, with the
  calling convention of the chosen reply format. The `python` format always uses the system prompt, since BFCL's
  Python-call convention is a prompting convention, not a template feature.
- BFCL function docs use `"type": "dict"` and a few other non-JSON-Schema names; `to_openai_tools` converts them
  the way BFCL's own function-calling handlers do.
- Tools released in the middle of an episode (BFCL miss_func) are announced in the user message of the turn that
  releases them: re-rendering the system prompt would rewrite the prefix the model already conditioned on.
- Untrusted text is plain text. A tool's result, a task's query, a synthesized task, a tool's description: none
  of it may become a template token. Tokenizing the rendered prompt would parse `<|im_end|><|im_start|>system`
  in a tool result as real control tokens (a forged turn), so every string that goes into the template is
  guarded first: each added token's text in it (`<|im_start|>`, `</tool_response>`, ...) becomes a private-use
  marker, and `encode` turns a marker into that text's plain-text tokens. Control tokens in the stream come from
  the template alone; with no such text in the input the tokens are exactly as before.
"""

from __future__ import annotations

import copy
import json
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

from coevolve.calls import parse_call
from coevolve.records import Task, ToolCall

_TYPE_NAMES = {
    "dict": "object", "float": "number", "double": "number", "tuple": "array", "list": "array", "any": "string",
    "bool": "boolean", "int": "integer", "long": "integer", "short": "integer", "char": "string",
}

PYTHON_SYSTEM = (
    "You are an expert in composing function calls. You are given a task and a set of functions. Make one or more "
    "function calls to accomplish the task.\n\n"
    "To call functions, reply with ONLY a list of calls in this exact format, with keyword arguments:\n"
    "[func_name1(param1=value1, param2=value2), func_name2(param=value)]\n"
    "You will then see the results. When the task is done, or no function can help, reply in plain words "
    "without any call; that ends your turn.\n\n"
    "Here is the list of functions in JSON format that you can invoke:\n{tools}\n"
)
TOOL_STYLES = ("json", "signatures")
"""How the system prompt lists the tools: BFCL's JSON docs, or one line per tool (name(param: type): what it
does) — about a third of the tokens, which on a CPU is a third of the prefill and of the training sequence."""

HERMES_SYSTEM = (
    "You are a helpful assistant that uses tools.\n\n# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    "XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>\n"
    "When the task is done, reply in plain words without any call; that ends your turn."
)

CODE_SYSTEM = (
    "You are an agent that acts by writing Python code. To act, reply with a ```python code block; it runs, and you "
    "will see what it printed. Use as many blocks, over as many replies, as you need. When the task is done, reply "
    "in plain words without a code block; that ends your turn.\n\n"
    "Here is what your code can call:\n{tools}\n"
)
"""The `code` reply format's prompt (AppWorld's and CodeAct's way of acting: one code block per action)."""

NEW_TOOLS_NOTE = "\n\n(New functions are now available: {tools})"

MARKER_BASE = 0x100000
"""Plane 16's private-use characters mark guarded control-token text (`ChatRenderer.guard`)."""
_MARKERS = re.compile("([\U00100000-\U0010FFFD])")


class TemplateError(ValueError):
    """The tokenizer's chat template cannot render a multi-turn tool conversation consistently."""


def _convert_schema(node: Any) -> Any:
    if isinstance(node, Mapping):
        out = {}
        for key, value in node.items():
            if key == "type" and isinstance(value, str):
                out[key] = _TYPE_NAMES.get(value, value)
            elif key == "response":
                continue  # BFCL's return-value docs: not part of a function schema
            else:
                out[key] = _convert_schema(value)
        return out
    if isinstance(node, list):
        return [_convert_schema(item) for item in node]
    return node


def tool_description(doc: Mapping[str, Any] | None, name: str = "") -> str:
    """A tool's own one-sentence description (BFCL's text after `Tool description:`), without a final period."""
    text = str((doc or {}).get("description") or "").strip()
    if "Tool description:" in text:
        text = text.split("Tool description:", 1)[1].strip()
    sentence = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0].rstrip(". ") if text else ""
    return sentence or f"Call {name or (doc or {}).get('name', 'it')}"


MAX_SHOWN_CHOICES = 12
"""Enum values a signature line shows at most (the rest as `|...`)."""


def tool_signature(doc: Mapping[str, Any]) -> str:
    """`- name(param: type, opt: type = default): description.` (the `signatures` tool style)."""
    parameters = doc.get("parameters") or {}
    required = set(parameters.get("required") or ())
    shown = []
    for name, schema in (parameters.get("properties") or {}).items():
        schema = schema if isinstance(schema, Mapping) else {}
        kind = _TYPE_NAMES.get(str(schema.get("type", "any")), str(schema.get("type", "any")))
        choices = schema.get("enum")
        if isinstance(choices, list) and choices:  # the values it takes, not just `string` (as the JSON styles show)
            kind = "|".join(json.dumps(value, ensure_ascii=False) for value in choices[:MAX_SHOWN_CHOICES])
            kind += "|..." if len(choices) > MAX_SHOWN_CHOICES else ""
        if name in required:
            shown.append(f"{name}: {kind}")
        else:
            shown.append(f"{name}: {kind} = {json.dumps(schema['default']) if 'default' in schema else 'optional'}")
    return f"- {doc['name']}({', '.join(shown)}): {tool_description(doc, doc['name'])}."


def to_openai_tools(docs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """BFCL function docs -> OpenAI / chat-template tool schemas (`{"type": "function", "function": {...}}`)."""
    tools = []
    for doc in docs:
        if doc.get("type") == "function" and "function" in doc:  # already in this shape
            tools.append(copy.deepcopy(dict(doc)))
            continue
        function = {"name": doc["name"], "description": doc.get("description", "")}
        function["parameters"] = _convert_schema(doc.get("parameters", {"type": "object", "properties": {}}))
        tools.append({"type": "function", "function": function})
    return tools


def with_keywords(call: ToolCall, docs: Sequence[Mapping[str, Any]]) -> ToolCall:
    """`f('x')` -> `f(name='x')` using the parameter order of the function's doc (JSON calls have no positions)."""
    if not call.positional:
        return call
    doc = next((d for d in docs if d.get("name") == call.name), None)
    names = list((doc or {}).get("parameters", {}).get("properties", {}))
    if len(names) < len(call.positional):
        return call
    named = dict(zip(names, call.positional))
    return ToolCall(call.name, {**named, **dict(call.arguments)})


def code_argument(call: ToolCall) -> str | None:
    """The code a call carries when its only argument is a string named `code` (a code-execution tool)."""
    if not call.positional and set(call.arguments) == {"code"} and isinstance(call.arguments["code"], str):
        return call.arguments["code"]
    return None


def format_calls(calls: Sequence[ToolCall], reply_format: str, docs: Sequence[Mapping[str, Any]] = ()) -> str:
    """A reply that makes `calls`, written the way the format expects (used for demonstrations). Positional
    arguments are named from `docs` (the JSON format has no positions)."""
    calls = [with_keywords(call, docs) for call in calls]
    if reply_format == "code":  # a call whose one argument is `code` (AppWorld's execute) is that code itself
        return "\n".join(f"```python\n{code_argument(call) or call.to_python()}\n```" for call in calls)
    if reply_format == "python":
        return "[" + ", ".join(call.to_python() for call in calls) + "]"
    blocks = [json.dumps({"name": call.name, "arguments": dict(call.arguments)}, ensure_ascii=False) for call in calls]
    return "\n".join(f"<tool_call>\n{block}\n</tool_call>" for block in blocks)


@dataclass
class ChatRenderer:
    """Renders opening prompts and between-reply pieces for one tokenizer and reply format."""

    tokenizer: Any
    reply_format: str = "python"
    demonstrations: tuple[tuple[Mapping[str, str], ...], ...] = ()
    """Worked examples (each a short conversation) placed after the system prompt, before the task."""
    system_prompt: str | None = None
    """Overrides the format's system prompt; `{tools}` in it is replaced by the tool list."""
    tool_style: str = "json"
    """`json` or `signatures` (see TOOL_STYLES); used where the tools go into the system prompt."""
    reasoning: str = "keep"
    """Reasoning across turns (see `REASONING`): `keep` (whatever the model writes, a `<think>` block included,
    stays in the context token for token, as sampled) or `off` (the template's no-thinking mode, e.g. Qwen3's
    `enable_thinking=False`: an empty think block in the prompt, not written by the model)."""
    _template_tools: bool | None = field(default=None, repr=False)
    _suffix: str | None = field(default=None, repr=False)
    _controls: tuple[Any, list[str], dict[str, str], set[int]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.reply_format not in ("hermes", "python", "code"):
            raise ValueError(f"unknown reply format {self.reply_format!r}; choose 'hermes', 'python' or 'code'")
        if self.tool_style not in TOOL_STYLES:
            raise ValueError(f"unknown tool style {self.tool_style!r}; choose one of {TOOL_STYLES}")
        if self.reasoning not in REASONING:
            raise ValueError(f"model.reasoning: {self.reasoning!r} is not one of {', '.join(REASONING)}")
        if self.reasoning == "strip":
            raise ValueError(STRIP_REFUSED)

    # -- template facts -------------------------------------------------------------------------------------
    @property
    def template_takes_tools(self) -> bool:
        """True when the chat template renders the `tools` argument (tested, not assumed)."""
        if self._template_tools is None and self.tokenizer is None:
            self._template_tools = True  # a chat endpoint (no local tokenizer): it applies its own template
        if self._template_tools is None:
            probe = [{"role": "user", "content": "hi"}]
            tool = to_openai_tools([{"name": "probe_tool_xyz", "description": "d", "parameters": {"type": "dict"}}])
            with_tools = self._apply(probe, tool, add_generation_prompt=False)
            self._template_tools = "probe_tool_xyz" in with_tools
        return self._template_tools

    @property
    def tools_in_template(self) -> bool:
        return self.reply_format == "hermes" and self.template_takes_tools

    @property
    def assistant_suffix(self) -> str:
        """What the template writes after an assistant message's content (e.g. `<|im_end|>\\n`)."""
        if self._suffix is None:
            marker = "XYZZY-reply-end"
            text = self._apply([{"role": "user", "content": "hi"}, {"role": "assistant", "content": marker}], None,
                               add_generation_prompt=False)
            position = text.rfind(marker)
            if position < 0:
                raise TemplateError("the chat template drops assistant messages")
            self._suffix = text[position + len(marker):]
        return self._suffix

    def stop_token_ids(self) -> list[int]:
        """Tokens that end a reply: the EOS token and the template's end-of-turn token."""
        stops = {self.tokenizer.eos_token_id}
        suffix_ids = self.encode(self.assistant_suffix)
        if suffix_ids and suffix_ids[0] in set(self.tokenizer.all_special_ids):
            stops.add(suffix_ids[0])
        return sorted(token for token in stops if token is not None)

    # -- messages -------------------------------------------------------------------------------------------
    def tool_list_text(self, docs: Sequence[Mapping[str, Any]]) -> str:
        if self.tool_style == "signatures":
            return "\n".join(tool_signature(doc) for doc in docs)
        tools = to_openai_tools(docs)
        if self.reply_format == "hermes":
            return "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
        return "[\n" + ",\n".join(json.dumps(tool["function"], ensure_ascii=False) for tool in tools) + "\n]"

    def opening_messages(self, docs: Sequence[Mapping[str, Any]], user_messages: Sequence[Mapping[str, str]]
                         ) -> list[dict[str, str]]:
        """System prompt (with the tools unless the template renders them), demonstrations, the first user turn."""
        if self.system_prompt is not None:
            system = self.system_prompt.replace("{tools}", self.tool_list_text(docs))
        elif self.tools_in_template:
            system = "You are a helpful assistant that uses tools. When the task is done, reply without a call."
        else:
            template = {"hermes": HERMES_SYSTEM, "code": CODE_SYSTEM}.get(self.reply_format, PYTHON_SYSTEM)
            if self.tool_style == "signatures":
                template = template.replace("Here is the list of functions in JSON format that you can invoke:",
                                            "Here are the functions you can call:")
            system = template.format(tools=self.tool_list_text(docs))
        messages = [{"role": "system", "content": system}]
        for demo in self.demonstrations:
            messages.extend(dict(message) for message in demo)
        messages.extend(dict(message) for message in user_messages)
        return messages

    def user_turn(self, user_messages: Sequence[Mapping[str, str]], new_docs: Sequence[Mapping[str, Any]] = ()
                  ) -> list[dict[str, str]]:
        messages = [dict(message) for message in user_messages]
        if new_docs:
            note = NEW_TOOLS_NOTE.format(tools=self.tool_list_text(new_docs))
            if messages:
                messages[-1]["content"] = messages[-1]["content"] + note
            else:
                messages = [{"role": "user", "content": note.strip()}]
        return messages

    @staticmethod
    def tool_messages(observations: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
        """(call name, observation) pairs -> tool messages, one per call, in call order."""
        return [{"role": "tool", "name": name, "content": observation} for name, observation in observations]

    # -- tokens ---------------------------------------------------------------------------------------------
    def _control_texts(self) -> tuple[Any, list[str], dict[str, str], set[int]]:
        """(a pattern matching any added token's text, those texts by marker index, text -> its marker, the added
        token ids), longest first; computed once per renderer."""
        if self._controls is None:
            decoder = getattr(self.tokenizer, "added_tokens_decoder", None) or {}
            texts = sorted({str(getattr(token, "content", token)) for token in decoder.values()} - {""},
                           key=lambda text: (-len(text), text))
            pattern = re.compile("|".join(re.escape(text) for text in texts)) if texts else None
            markers = {text: chr(MARKER_BASE + position) for position, text in enumerate(texts)}
            self._controls = (pattern, texts, markers, set(decoder))
        return self._controls

    def guard(self, value: Any) -> Any:
        """`value` (a string, or messages and tools holding strings) with every control-token text in it
        replaced by its marker, so that only the template itself writes control tokens (see the module notes)."""
        if isinstance(value, str):
            pattern, _, markers, _ = self._control_texts()
            value = _MARKERS.sub("\ufffd", value)  # a marker character in the input itself means nothing
            if pattern is None:
                return value
            return pattern.sub(lambda match: markers[match.group(0)], value)
        if isinstance(value, Mapping):
            return {key: self.guard(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.guard(item) for item in value]
        return value

    def render(self, messages: Sequence[Mapping[str, Any]], tools: list[dict[str, Any]] | None = None,
               add_generation_prompt: bool = True) -> str:
        """The template applied to guarded messages and tools (what `encode` takes)."""
        return self._apply(messages, tools, add_generation_prompt)

    def _apply(self, messages: Sequence[Mapping[str, Any]], tools: list[dict[str, Any]] | None,
               add_generation_prompt: bool) -> str:
        extra = {"enable_thinking": False} if self.reasoning == "off" else {}
        if self.tokenizer is not None:
            messages, tools = self.guard(list(messages)), self.guard(tools) if tools else None
        return self.tokenizer.apply_chat_template(list(messages), tools=tools or None, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt, **extra)

    def _template_tools_arg(self, docs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
        return to_openai_tools(docs) if self.tools_in_template and docs else None

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text: the template's control tokens as tokens, guarded text (markers) as the
        plain text it stands for."""
        if not _MARKERS.search(text):
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        texts = self._control_texts()[1]
        ids: list[int] = []
        for position, piece in enumerate(_MARKERS.split(text)):
            if position % 2:
                index = ord(piece) - MARKER_BASE
                ids += self.plain_ids(texts[index]) if index < len(texts) else self.plain_ids("\ufffd")
            elif piece:
                ids += self.tokenizer(piece, add_special_tokens=False)["input_ids"]
        return ids

    def plain_ids(self, text: str) -> list[int]:
        """`text` as plain-text tokens: no added token (special or not) among them, whatever the text holds."""
        ids = list(self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
        if not self._control_texts()[3].intersection(ids):
            return ids
        # A non-special added token (Qwen's `</tool_response>`) is matched even so: one character at a time.
        return [token for character in text
                for token in self.tokenizer(character, add_special_tokens=False,
                                            split_special_tokens=True)["input_ids"]]

    def render_prompt(self, messages: Sequence[Mapping[str, str]], docs: Sequence[Mapping[str, Any]] = ()) -> str:
        return self._apply(messages, self._template_tools_arg(docs), add_generation_prompt=True)

    def prompt_ids(self, messages: Sequence[Mapping[str, str]], docs: Sequence[Mapping[str, Any]] = ()) -> list[int]:
        return self.encode(self.render_prompt(messages, docs))

    def continuation(self, new_messages: Sequence[Mapping[str, str]], docs: Sequence[Mapping[str, Any]] = (),
                     reply_ended_with: int | None = None) -> list[int]:
        """Tokens that follow a model reply: the rest of the assistant turn, `new_messages`, the generation prompt.

        `reply_ended_with` is the reply's last token; when it is the template's end-of-turn token, that part of
        the suffix is already in the stream (as a model token) and is not repeated.

        Found by rendering a reference conversation whose last reply is a marker, with `new_messages` after it:
        what follows the marker is the assistant suffix and then the text wanted. Templates that rewrite earlier
        assistant messages once more messages follow (Qwen3 writes an empty `<think>` block into the last
        assistant message only, and drops earlier turns' reasoning after a new user message) change only what
        comes *before* an earlier reply's content; the model's own tokens stay in the stream as sampled, which is
        `reasoning: keep`. A template that changes what follows a reply's content is refused."""
        tools = self._template_tools_arg(docs)
        marker = "XYZZY-reply-end"
        base = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                {"role": "assistant", "content": marker}]
        after = self._apply(base + [dict(m) for m in new_messages], tools, add_generation_prompt=True)
        position = after.rfind(marker)
        rest = after[position + len(marker):] if position >= 0 else ""
        if position < 0 or not rest.startswith(self.assistant_suffix):
            raise TemplateError("the chat template changes what follows a reply once more messages come; "
                                "multi-turn masks cannot be built from it (set model.chat_template to a template "
                                "that keeps earlier replies, e.g. one of TRL's *_training templates)")
        suffix = self.assistant_suffix
        if reply_ended_with is not None:
            ended = self.tokenizer.decode([reply_ended_with])
            if ended and suffix.startswith(ended):
                suffix = suffix[len(ended):]
        # The stream so far ends with the reply (and maybe its end token): the suffix's remainder, then the rest.
        return self.encode(suffix + rest[len(self.assistant_suffix):])


REASONING = ("keep", "strip", "off")
"""`model.reasoning` choices; `strip` is refused (STRIP_REFUSED)."""
STRIP_REFUSED = ("model.reasoning: strip (drop earlier turns' reasoning, as Qwen3's template does at inference) would "
                 "re-render the context between turns, so an episode is no longer one token sequence and the trainer "
                 "would score tokens the model never saw; use keep (the sampled reasoning stays in context) or off "
                 "(no reasoning)")

DONE_MESSAGE = "Done."


DemoChoice = Literal["first-tool", "coverage"]
"""How worked examples are picked (`build_demonstrations`)."""
DEMO_CHOICES: tuple[str, ...] = typing.get_args(DemoChoice)


def _tools_of(task: Task) -> list[str]:
    """The tool names of the task's first-turn ground truth, in call order."""
    return [call.split("(")[0] for call in (task.ground_truth[0] if task.ground_truth else ())]


def build_demonstrations(env: Any, tasks: Sequence[Task], reply_format: str, count: int, choice: str = "first-tool"
                         ) -> tuple[tuple[dict[str, str], ...], ...]:
    """Worked examples for the prompt: the first turn of `count` tasks, solved by their ground truth.

    Each is a real conversation, not a made-up one: the user's request, one reply making the ground-truth calls
    in `reply_format`, the tool results the env actually returned, and a closing reply without calls (the turn
    ending the format asks for). Which tasks (`choice`):
    - `first-tool`: in order, preferring ones whose first call is a tool not yet shown;
    - `coverage`: each pick is the first task showing the most tools not yet shown, counting every call of its
      first turn, so a multi-call task (BFCL-lite's `cd` then act) is shown when there is one. A small model copies
      its examples: with `first-tool` SmolLM2 never saw two calls in one reply and never solved a two-call task.
    Callers must take them from tasks that are not evaluated."""
    if choice not in DEMO_CHOICES:
        raise ValueError(f"unknown demonstration choice {choice!r} (one of {', '.join(DEMO_CHOICES)})")
    if count <= 0:
        return ()
    chosen: list[Task] = []
    seen_tools: set[str] = set()
    candidates = [task for task in tasks if _tools_of(task)]
    if choice == "coverage":
        while len(chosen) < count and len(chosen) < len(candidates):
            # max() keeps the first of equal scores: ties go to the earlier task.
            pick = max((task for task in candidates if task not in chosen),
                       key=lambda task: len(set(_tools_of(task)) - seen_tools))
            chosen.append(pick)
            seen_tools.update(_tools_of(pick))
    for prefer_new in (True, False):
        for task in candidates:
            if len(chosen) >= count:
                break
            first = _tools_of(task)[0]
            if task in chosen or (prefer_new and first in seen_tools):
                continue
            chosen.append(task)
            seen_tools.add(first)
    demos = []
    for task in chosen:
        episode = env.reset(task)
        user = [dict(m) for m in episode.user_messages()]
        parsed = [parse_call(call) for call in task.ground_truth[0]]
        steps = episode.act(list(task.ground_truth[0]))
        if not all(isinstance(call, ToolCall) for call in parsed) or not all(step.ok for step in steps):
            continue  # a ground truth that does not run cleanly teaches nothing
        results = ChatRenderer.tool_messages([(step.call.name, step.observation) for step in steps if step.call])
        reply = {"role": "assistant", "content": format_calls(parsed, reply_format, episode.tools())}
        demos.append(tuple(user + [reply] + results + [{"role": "assistant", "content": DONE_MESSAGE}]))
    return tuple(demos)
