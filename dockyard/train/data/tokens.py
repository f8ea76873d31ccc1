"""Rows → tokenized examples: input_ids, and labels that are IGNORE where the loss must not count (a prompt, the
turns that are not the assistant's). A long text is read only as far as max_seq_length keeps it; the chat template
(the model folder's code) renders within a time and memory bound."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from dockyard.common.errors import DockyardError, Stopped, cause_line, signals_unwrapped
from dockyard.common.units import human
from dockyard.train.data.formats import CHAT_FORMATS, CHAT_ROLES, to_messages, whole_labels
from dockyard.train.limits import TooSlow, memory_limit, time_limit

log = logging.getLogger(__package__)  # dockyard.train.data, whichever module says it: rank 0 alone (logs.setup_logging)


IGNORE = -100  # label value the loss skips

# What a signal handler raises while a text is tokenized or a template rendered (Ctrl-C, the trainer's SIGTERM, the
# template's alarm): each passes through as itself, also where Python wrapped it in "RuntimeError: Error calling
# __set_name__ ..." (landing while a lazy import, jinja2's or the tokenizer's, built a class)
STOPS = (KeyboardInterrupt, Stopped, TooSlow)


# For a tokenizer without a chat template of its own (the tiny sample model, base models): role tags, the
# assistant turn ended by the EOS token. It is saved with the trained model, so inference uses the same one.
FALLBACK_CHAT_TEMPLATE = (
    "{% if bos_token %}{{ bos_token }}{% endif %}"
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\n' + m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def tokenize(rows: list[dict[str, Any]], fmt: str, tokenizer: Any, max_len: int, what: str = "") -> Tokenized:
    """input_ids and labels (IGNORE where the loss must not count) for every row of a causal-LM format."""
    if fmt in CHAT_FORMATS and not tokenizer.chat_template:
        log.info("the tokenizer has no chat template: using dockyard's plain one (saved with the model)")
        tokenizer.chat_template = FALLBACK_CHAT_TEMPLATE
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    out = Tokenized([])
    for n, row in enumerate(rows, 1):
        try:
            if fmt == "text":
                ids = text_tokens(row, tokenizer, eos, max_len)
                labels = list(ids)
            elif fmt == "prompt_completion":
                prompt = head_tokens(tokenizer, str(row["prompt"]), max_len, add_special_tokens=True)
                completion = head_tokens(tokenizer, str(row["completion"]), max_len, add_special_tokens=False) + eos
                ids, labels = prompt + completion, [IGNORE] * len(prompt) + completion
            else:
                messages = to_messages(row, fmt, n)
                ids, labels = chat_tokens(messages, tokenizer, n, max_len)
                for role in {m["role"] for m in messages} - CHAT_ROLES:
                    out.other_roles[role] = out.other_roles.get(role, 0) + 1
        except CannotEncode as e:
            raise DockyardError(f"{what + ': ' if what else ''}example {n}: {e}") from None
        except DockyardError as e:  # "example 3" of the evaluation data read as the training data's third
            if not what or fmt not in CHAT_FORMATS:
                raise
            raise DockyardError(f"{what}: {e}") from None
        if len(ids) > max_len:
            out.truncated += 1
            ids, labels = ids[:max_len], labels[:max_len]
        if any(label != IGNORE for label in labels[1:]):
            out.examples.append({"input_ids": ids, "labels": labels})
        else:
            out.dropped += 1
    if not out.examples:
        if not out.truncated:  # nothing was cut: a longer max_seq_length cannot help
            raise DockyardError(f"no example{' of ' + what if what else ''} has a token to learn from: every one is "
                                "empty, or (prompt_completion, chat) has nothing to learn after its prompt; check "
                                "the data (docs/data.md)")
        raise DockyardError(f"no example{' of ' + what if what else ''} has a token to learn from within "
                            f"max_seq_length={max_len}: raise it (-- --max_seq_length 2048)")
    return out


@dataclass
class Tokenized:
    examples: list[dict[str, Any]]
    truncated: int = 0     # examples cut at max_seq_length
    dropped: int = 0       # examples with no token left to learn from after the cut
    other_roles: dict[str, int] = field(default_factory=dict)  # chat roles the loss never learns: examples of each


# characters of a document tokenized when only its first max_len tokens are kept: a token is rarely 8 characters,
# never 64; a whole book on one line (tens of MB) took GBs of memory per process to be cut to 128 tokens
CHARS_PER_TOKEN_BOUND = 64


def text_tokens(row: dict[str, Any], tokenizer: Any, eos: list[int], keep: int = 0) -> list[int]:
    """A text document's tokens: the tokenizer's special tokens (BOS), then its EOS (`eos`, [] without one).
    `keep`: only the first `keep` tokens are used (the rest are cut), so a long document's head alone is read; 0:
    all of it (packing), a long one read in pieces."""
    text = str(row["text"])
    ids = head_tokens(tokenizer, text, keep, add_special_tokens=True) if keep else piecewise_tokens(tokenizer, text)
    return ids if keep and len(ids) > keep else ids + eos


# characters tokenized in one call where a document is read whole (packing): the tokenizer holds ~200 bytes per
# character while it works, so one 14 MB document (a book on one line) took 3 GB in every process
PIECE_CHARS = 1 << 20


def piecewise_tokens(tokenizer: Any, text: str) -> list[int]:
    """`text`'s tokens with the tokenizer's special tokens, a long text tokenized a piece at a time (PIECE_CHARS
    at most), each cut where a run of whitespace begins, so no word and no run of newlines is split (the tokens of
    a word keep the space before it): the same tokens as a whole read, for tokenizers that split text at
    whitespace before they merge (byte-level BPE, SentencePiece's Llama 3 and later)."""
    if len(text) <= PIECE_CHARS:
        return encode(tokenizer, text, add_special_tokens=True)
    ids: list[int] = []
    start = 0
    while start < len(text):
        end = len(text) if len(text) - start <= PIECE_CHARS else _piece_end(text, start)
        ids += encode(tokenizer, text[start:end], add_special_tokens=False)
        start = end
    first = text[:min(len(text), 64)]  # the special tokens around a text: where its plain tokens sit in its full ones
    plain, full = (encode(tokenizer, first, add_special_tokens=s) for s in (False, True))
    at = next((i for i in range(len(full) - len(plain) + 1) if full[i:i + len(plain)] == plain), 0)
    return full[:at] + ids + full[at + len(plain):]


def _piece_end(text: str, start: int) -> int:
    """Where the piece of `text` from `start` ends: before the last run of whitespace that begins in its
    PIECE_CHARS (a newline's first, else a space's), or at PIECE_CHARS where it holds none."""
    stop = start + PIECE_CHARS
    cut = max(text.rfind("\n", start + 1, stop), 0) or max(text.rfind(" ", start + 1, stop), 0)
    if not cut:
        return stop
    while cut > start + 1 and text[cut - 1].isspace():
        cut -= 1
    return cut


def head_tokens(tokenizer: Any, text: str, keep: int, **kwargs: Any) -> list[int]:
    """`text`'s tokens, or where only its first `keep` are used (0: all) and it is long, those of its head alone:
    more tokens than are kept, which the example is cut to as a whole would be. A prompt, a chat turn or a
    classifier's text of 15 MB (one field) took 4 GB per process to keep 128 tokens."""
    return read_head(tokenizer, text, keep, **kwargs)[1]


def read_head(tokenizer: Any, text: str, keep: int, **kwargs: Any) -> tuple[str, list[int]]:
    """(the text head_tokens read, its tokens)."""
    if keep and len(text) > keep * CHARS_PER_TOKEN_BOUND:
        head = text[:keep * CHARS_PER_TOKEN_BOUND]
        ids = encode(tokenizer, head, **kwargs)
        if len(ids) > keep:
            return head, ids
    return text, encode(tokenizer, text, **kwargs)


class CannotEncode(DockyardError):
    """The model folder's tokenizer failed on a text (said with the example's number by the caller)."""


def encode(tokenizer: Any, text: str, **kwargs: Any) -> list[int]:
    """`text`'s token ids. A tokenizer that fails on it is the model folder's: its tokenizer.json's regex past the
    backtracking limit (a Rust panic, which is a BaseException), a WordPiece vocabulary without its [UNK], ... were a
    traceback of hundreds of lines on every rank."""
    try:
        with signals_unwrapped(STOPS):
            return tokenizer(text, **kwargs)["input_ids"]
    except (*STOPS, SystemExit, DockyardError):
        raise
    except BaseException as e:  # noqa: BLE001 - pyo3's PanicException derives from BaseException alone
        raise CannotEncode(f"the model's tokenizer cannot encode it ({type(e).__name__}: {cause_line(e)}): check "
                           "tokenizer.json and tokenizer_config.json in the model folder, or use the model's own "
                           "tokenizer files") from None


def chat_tokens(messages: list[dict[str, str]], tokenizer: Any, n: int, keep: int = 0) -> tuple[list[int], list[int]]:
    """The conversation through the chat template, learning only the assistant turns: each turn's text is
    what the template adds to the conversation so far (templates render a conversation as a prefix of its
    continuation), tokenized on its own; `keep`: only the first `keep` tokens are used (0: all)."""
    def render(msgs: list[dict[str, str]], generation_prompt: bool) -> str:
        try:
            with signals_unwrapped((*STOPS, MemoryError)), time_limit(RENDER_SECONDS), memory_limit(RENDER_BYTES):
                return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=generation_prompt)
        except TooSlow:
            raise DockyardError(f"example {n}: the model's chat template took more than {RENDER_SECONDS} s to render "
                                f"one conversation (a loop without end?): {CHECK_TEMPLATE}") from None
        except MemoryError:
            raise DockyardError(f"example {n}: the model's chat template took more than {human(RENDER_BYTES)} of "
                                f"memory to render one conversation (a string without end?): {CHECK_TEMPLATE}") from None
        except Exception as e:  # noqa: BLE001 - a template raises what it likes (jinja2's TemplateError, mostly)
            raise DockyardError(f"example {n}: the model's chat template refuses this conversation: "
                                f"{cause_line(e)}") from None

    if len(messages) > MAX_TURNS:  # each assistant turn renders the conversation so far: work grows as its square
        raise DockyardError(f"example {n}: {len(messages):,} turns in one conversation, past the {MAX_TURNS:,} a "
                            "chat example is read with (rendering it takes minutes, on every rank): split it into "
                            "several conversations")
    ids: list[int] = []
    labels: list[int] = []
    done = ""

    def add(text: str, learn: bool) -> None:
        nonlocal done
        piece = head_tokens(tokenizer, text[len(done):], max(keep - len(ids), 1) if keep else 0,
                            add_special_tokens=False)
        ids.extend(piece)
        labels.extend(piece if learn else [IGNORE] * len(piece))
        done = text

    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before, through = render(messages[:i], True), render(messages[: i + 1], False)
        if not before.startswith(done) or not through.startswith(before):
            raise DockyardError(f"example {n}: the tokenizer's chat template does not render a conversation as "
                                f"a prefix of its continuation, so the assistant turns cannot be found; convert "
                                f"the data to prompt/completion")
        add(before, learn=False)
        learnt = len(ids)
        add(through, learn=True)
        if len(ids) == learnt:  # "raise max_seq_length" was the advice, which could not help
            raise DockyardError(f"example {n}: the model's chat template renders nothing for an assistant turn, so "
                                "there is nothing to learn: use a template that renders the assistant's messages, or "
                                "convert the data to prompt/completion")
        if keep and len(ids) > keep:  # cut (one token past `keep` says so): the turns after it are not read
            break
    return ids, labels


MAX_TURNS = 1000  # messages in one chat example: 1,000 render in ~6 s, 3,000 took minutes


RENDER_SECONDS = 10  # one conversation through a chat template: milliseconds; a template is the model folder's code


RENDER_BYTES = 4 << 30  # memory one render may take: kilobytes; a template that doubles a string 40 times asks a terabyte
CHECK_TEMPLATE = "check chat_template in the model folder's tokenizer_config.json (or chat_template.jinja)"


def pack_text(rows: list[dict[str, Any]], tokenizer: Any, max_len: int) -> list[dict[str, list[int]]]:
    """Text documents as pretraining reads them: each tokenized as the text format does (its special tokens, EOS
    at its end), all joined into one stream, cut into blocks of `max_len` tokens; the last block holds what is left
    (shorter: the collator pads it). No token is padding and none is cut away. A block's tokens attend to the
    documents before them in the block, the EOS marking where each ends."""
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    blocks: list[list[int]] = []
    rest: list[int] = []  # the stream not yet cut (less than a block between documents): never held whole
    for n, row in enumerate(rows, 1):
        try:
            rest += text_tokens(row, tokenizer, eos)
        except CannotEncode as e:
            raise DockyardError(f"example {n}: {e}") from None
        cut = len(rest) - len(rest) % max_len
        blocks += [rest[i:i + max_len] for i in range(0, cut, max_len)]
        del rest[:cut]
    blocks.append(rest)
    out = [{"input_ids": b, "labels": list(b)} for b in blocks if len(b) > 1]  # one token predicts nothing
    if not out:
        raise DockyardError("the text data holds no token to learn from")
    return out


def seq_cls_examples(rows: list[dict[str, Any]], tokenizer: Any, max_len: int, names: list[str]) -> Tokenized:
    index = {name: i for i, name in enumerate(names)}
    whole_labels(rows)
    unknown = sorted({str(r["label"]) for r in rows} - set(index))
    if unknown:
        raise DockyardError(f"labels not seen in the training data: {', '.join(unknown[:5])}")
    out = Tokenized([])
    for n, r in enumerate(rows, 1):
        try:
            text, ids = read_head(tokenizer, str(r["text"]), max_len)
            if len(ids) > max_len:  # cut as the tokenizer cuts: its special tokens (an encoder's [SEP]) kept
                out.truncated += 1
                ids = encode(tokenizer, text, truncation=True, max_length=max_len)
        except CannotEncode as e:
            raise DockyardError(f"example {n}: {e}") from None
        out.examples.append({"input_ids": ids, "labels": index[str(r["label"])]})
    return out
