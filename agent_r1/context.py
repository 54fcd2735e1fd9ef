"""Context managers: what token ids the policy sees at each turn.

A context manager tokenizes the task prompt once and each tool observation once (through the
tokenizer's chat template), keeps the sampled action ids as they are, and builds the next
turn's context from those pieces. Whatever it builds is stored in the Step, so training sees
exactly the context the policy saw. Three forms: the full history (:class:`ContextManager`), a
sliding window of the last turns (:class:`SlidingWindow`), and a summary of the older turns once
the history passes a token budget (:class:`Summary`); ``env.context`` names one of them or a
user's subclass by import path (``module:Class``, ``path/to/file.py:Class``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class EpisodeContext:
    prompt_ids: list[int]
    turns: list[tuple[list[int], list[int]]] = field(default_factory=list)  # (action, observation)
    messages: list[dict] = field(default_factory=list)  # the opening chat messages
    observations: list[list[dict]] = field(default_factory=list)  # each turn's tool messages, as given
    summaries: dict[int, str] = field(default_factory=dict)  # Summary: the summary of the first n turns


class ObservationRenderer:
    """Renders tool messages to the token ids that follow an assistant turn, via the chat template.

    The template is applied to a fixed dummy conversation with and without the tool messages;
    the difference (everything after the assistant's end-of-turn token, up to and including the
    next assistant generation prompt) is the observation's text. This works for any chat
    template that renders a conversation left to right, ours and Qwen's alike.
    """

    _DUMMY = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos = tokenizer.eos_token
        prefix = tokenizer.apply_chat_template(self._DUMMY, tokenize=False)
        self._cut = prefix.rindex(self.eos) + len(self.eos)

    def text(self, messages: list[dict]) -> str:
        full = self.tokenizer.apply_chat_template(
            self._DUMMY + list(messages), tokenize=False, add_generation_prompt=True
        )
        return full[self._cut :]

    def ids(self, messages: list[dict], action_ended: bool = True) -> list[int]:
        ids = self.tokenizer.encode(self.text(messages), add_special_tokens=False)
        # A turn cut off by max_new_tokens never sampled its end-of-turn token: close it here
        # (as context, never as a trained action token).
        return ids if action_ended else [self.tokenizer.eos_token_id] + ids


class ContextManager:
    """Full history: the prompt followed by every action and observation so far."""

    def __init__(self, tokenizer, tools: list[dict] | None = None):
        self.tokenizer = tokenizer
        self.tools = tools
        self.renderer = ObservationRenderer(tokenizer)

    def start(self, messages: list[dict]) -> EpisodeContext:
        text = self.tokenizer.apply_chat_template(
            messages, tools=self.tools, tokenize=False, add_generation_prompt=True
        )
        return EpisodeContext(self.tokenizer.encode(text, add_special_tokens=False), messages=list(messages))

    def observe(self, ctx: EpisodeContext, action_ids: list[int], observation: list[dict]) -> None:
        ended = bool(action_ids) and action_ids[-1] == self.tokenizer.eos_token_id
        ctx.turns.append((list(action_ids), self.renderer.ids(observation, action_ended=ended)))
        ctx.observations.append(list(observation))

    def visible_turns(self, ctx: EpisodeContext) -> list[tuple[list[int], list[int]]]:
        return ctx.turns

    def context_ids(self, ctx: EpisodeContext) -> list[int]:
        ids = list(ctx.prompt_ids)
        for action, obs in self.visible_turns(ctx):
            ids += action + obs
        return ids


class SlidingWindow(ContextManager):
    """The task prompt plus the last ``window`` turns (action + observation)."""

    def __init__(self, tokenizer, tools: list[dict] | None = None, window: int = 2):
        super().__init__(tokenizer, tools)
        if window < 1:
            raise ValueError(f"context.window must be >= 1, got {window}")
        self.window = window

    def visible_turns(self, ctx: EpisodeContext) -> list[tuple[list[int], list[int]]]:
        return ctx.turns[-self.window :]


_PASSAGE = re.compile(r"^\(\d+\) ([^:\n]+): (.*)$", re.M)  # a search result line: "(1) Title: text"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


def first_sentence(text: str, max_chars: int = 200) -> str:
    """The first sentence of ``text`` (at most ``max_chars`` characters)."""
    text = " ".join(text.split())
    return _SENTENCE_END.split(text, maxsplit=1)[0][:max_chars]


def extractive_summary(observations: list[list[dict]]) -> str:
    """The default summary of earlier turns, deterministic and extractive: for each retrieved
    passage (``(k) Title: text`` lines, as the search tool writes them) its title and first
    sentence; for any other tool message its name and first sentence."""
    lines = []
    for turn in observations:
        for message in turn:
            content = str(message.get("content", ""))
            passages = _PASSAGE.findall(content)
            if passages:
                lines += [f"- {title}: {first_sentence(text)}" for title, text in passages]
            elif content.strip():
                lines.append(f"- {message.get('name', 'tool')}: {first_sentence(content)}")
    return "Found in earlier turns:\n" + ("\n".join(lines) if lines else "- nothing")


class PolicySummarizer:
    """A summary written by the policy itself (``env.context_kwargs: {summarize: policy}``): the
    model, asked with :attr:`PROMPT`, writes at most ``max_new_tokens`` greedily about the tool
    messages of the summarised turns. Greedy, so the same weights give the same summary; the
    summary is part of the context the policy then sees (and trains on as context, not action)."""

    PROMPT = ("Summarize these search results in at most two sentences. Keep every name, place and "
              "fact that a question about them could need.")

    def __init__(self, model, tokenizer, max_new_tokens: int = 64):
        self.model, self.tokenizer, self.max_new_tokens = model, tokenizer, max_new_tokens

    def __call__(self, observations: list[list[dict]]) -> str:
        import torch

        text = "\n".join(str(m.get("content", "")) for turn in observations for m in turn)
        messages = [{"role": "system", "content": self.PROMPT}, {"role": "user", "content": text or "(none)"}]
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        device = next(self.model.parameters()).device
        was = self.model.training
        self.model.eval()
        with torch.no_grad():
            out = self.model.generate(torch.tensor([list(ids)], device=device), max_new_tokens=self.max_new_tokens,
                                      do_sample=False, pad_token_id=self.tokenizer.pad_token_id)
        self.model.train(was)
        written = self.tokenizer.decode(out[0, len(ids):], skip_special_tokens=True).strip()
        return "Summary of earlier turns: " + (written or "(empty)")


class Summary(ContextManager):
    """The full history until it passes ``budget`` tokens; from then on every turn but the last
    ``keep`` is replaced by a summary of what those turns observed, appended to the task's user
    message (the prompt is re-rendered with it; the kept turns follow as they were sampled).

    ``summarize`` maps the summarised turns' observations (chat messages) to text: a callable,
    its import path from a config, or a :class:`PolicySummarizer` (``summarize: policy`` in a
    config: the pipeline builds it over the policy); default :func:`extractive_summary`. An
    episode's summary of its first n turns is written once. Each step stores the context ids this
    returns, so training sees the summarised context the policy saw.
    """

    def __init__(self, tokenizer, tools: list[dict] | None = None, budget: int = 512, keep: int = 1,
                 summarize: Callable[[list[list[dict]]], str] | str | None = None):
        super().__init__(tokenizer, tools)
        if budget < 1 or keep < 0:
            raise ValueError(f"summary context: budget must be >= 1 and keep >= 0, got budget={budget}, keep={keep}")
        self.budget, self.keep = budget, keep
        if summarize == "policy":
            raise ValueError("summary context: summarize='policy' needs the policy: pass "
                             "PolicySummarizer(model, tokenizer) (the pipeline does this for a config's 'policy')")
        if isinstance(summarize, str):  # an import path from a config: module:fn or path/to/file.py:fn
            from agent_r1.registry import load_object

            summarize = load_object(summarize, "summarize")
        self.summarize = summarize or extractive_summary

    def context_ids(self, ctx: EpisodeContext) -> list[int]:
        full = super().context_ids(ctx)
        n_old = len(ctx.turns) - self.keep
        if len(full) <= self.budget or n_old <= 0 or not ctx.messages:
            return full
        user = max(i for i, m in enumerate(ctx.messages) if m["role"] == "user")
        if n_old not in ctx.summaries:
            ctx.summaries[n_old] = self.summarize(ctx.observations[:n_old])
        messages = [dict(m) for m in ctx.messages]
        messages[user]["content"] = f"{messages[user]['content']}\n\n{ctx.summaries[n_old]}"
        ids = self.start(messages).prompt_ids
        for action, obs in ctx.turns[n_old:]:
            ids += action + obs
        return ids


CONTEXT_MANAGERS = {"full": ContextManager, "sliding_window": SlidingWindow, "summary": Summary}


def get_context_manager(name: str) -> type[ContextManager]:
    """The context manager class ``name`` names: ``full``, ``sliding_window``, ``summary``, or an
    import path (``module:Class`` / ``path/to/file.py:Class``) to a :class:`ContextManager` subclass."""
    from agent_r1.registry import named_class

    return named_class(name, CONTEXT_MANAGERS, ContextManager, "context manager")


def make_context_manager(name: str, tokenizer, tools: list[dict] | None = None, **kwargs) -> ContextManager:
    """The context manager ``name`` (see :func:`get_context_manager`) with its settings ``kwargs``."""
    return get_context_manager(name)(tokenizer, tools, **kwargs)
