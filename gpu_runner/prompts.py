"""The prompts the CLI uses: the default chat prompt and the multilingual ``verify`` set.

Each ``verify`` prompt asks for text that byte-level tokenizers split inside UTF-8
characters (CJK, kana, Arabic, Devanagari, emoji with ZWJ and modifiers), or for code, whose
whitespace runs and punctuation stress the other end. A small model's answers are not always
good language, but they are real streams of ids, which is what the check needs.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_CHAT_PROMPT", "VERIFY_PROMPTS", "VerifyPrompt"]

#: Asks for Japanese and an emoji: the case the plugin exists for. With SmolLM2-135M-Instruct
#: and greedy decoding the reply mixes kana and emoji and ends at EOS within 40 tokens, and
#: a per-token decode of it shows a dozen U+FFFD.
DEFAULT_CHAT_PROMPT = "What is 'hello' in Japanese? Reply with the Japanese word and an emoji."


@dataclass(frozen=True, slots=True)
class VerifyPrompt:
    label: str
    text: str


VERIFY_PROMPTS: tuple[VerifyPrompt, ...] = (
    VerifyPrompt("chinese", "Translate to Chinese: The weather is nice today. 今天天气"),
    VerifyPrompt("japanese", "Say good morning in Japanese kana, then add an emoji."),
    VerifyPrompt("arabic", "Translate to Arabic: Hello world, how are you? مرحبا"),
    VerifyPrompt("emoji", "Reply only with emoji: a family 👨‍👩‍👧‍👦, a flag 🇯🇵, a thumbs up 👍🏽."),
    VerifyPrompt("code", "Write a Python function that squares a number, with a comment in Chinese."),
    VerifyPrompt("korean", "Write one sentence in Korean about the sea. 바다"),
    VerifyPrompt("hindi", "Say hello in Hindi and in Russian: नमस्ते, привет"),
    VerifyPrompt("mixed", "Write 'café naïve façade — “quotes” … €100 ❤️‍🔥' three times."),
)
