"""Context managers: what token ids the policy sees at each turn.

A context manager tokenizes the task prompt once and each tool observation once (through the
tokenizer's chat template), keeps the sampled action ids as they are, and builds the next
turn's context from those pieces. Whatever it builds is stored in the Step, so training sees
exactly the context the policy saw.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EpisodeContext:
    prompt_ids: list[int]
    turns: list[tuple[list[int], list[int]]] = field(default_factory=list)  # (action, observation)


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
        return EpisodeContext(self.tokenizer.encode(text, add_special_tokens=False))

    def observe(self, ctx: EpisodeContext, action_ids: list[int], observation: list[dict]) -> None:
        ended = bool(action_ids) and action_ids[-1] == self.tokenizer.eos_token_id
        ctx.turns.append((list(action_ids), self.renderer.ids(observation, action_ended=ended)))

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


CONTEXT_MANAGERS = {"full": ContextManager, "sliding_window": SlidingWindow}


def make_context_manager(name: str, tokenizer, tools: list[dict] | None = None, **kwargs) -> ContextManager:
    if name not in CONTEXT_MANAGERS:
        raise ValueError(f"unknown context manager {name!r}; known: {sorted(CONTEXT_MANAGERS)}")
    return CONTEXT_MANAGERS[name](tokenizer, tools, **kwargs)
