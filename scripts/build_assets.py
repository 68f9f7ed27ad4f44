"""Build the embedded default: a tiny pretrained Llama, its tokenizer, and the demo SFT data.

    python scripts/build_assets.py                 # the shipped assets (about 10 minutes on 2 idle CPU cores)
    python scripts/build_assets.py --quick --out /tmp/x   # a smoke run of the whole pipeline (seconds)

The base model is pretrained from scratch on generated plain-text "word games" ("the word kelmu backwards is
umlek.", "kelmu in capitals is KELMU.", ...). It has never seen a chat turn. The demo task asks, in chat form,
for a word reversed; in that form the base model answers none correctly (it keeps writing prose), and a LoRA
adapter trained for about a minute on the demo data makes it answer most held-out words correctly.
Held-out words appear neither in the pretraining text nor in the SFT training data.

Everything is seeded; on the same torch version and thread count the weights are bit-identical, and BUILD.json
records their sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import string
import time
from pathlib import Path

import torch

SPECIALS = ["<|pad|>", "<|bos|>", "<|end|>", "<|unk|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHARS = string.ascii_lowercase + string.ascii_uppercase + string.digits + " .,:;!?'\"-+=*/()[]\n"
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
ONSETS, NUCLEI = "bcdfghjklmnprstvwz", "aeiou"
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "src" / "loraflow" / "assets"


def build_tokenizer(out: Path):
    """One token per character (so reversal is a token-level skill) plus chat special tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(CHARS))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(SPECIALS)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<|bos|>", eos_token="<|end|>",
                                  pad_token="<|pad|>", unk_token="<|unk|>")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    return tok


class Words:
    def __init__(self, seed: int, banned: set[str] = frozenset()):
        self.rng, self.banned = random.Random(seed), banned

    def __call__(self) -> str:
        while True:
            pairs = self.rng.randint(2, 4)
            word = "".join(self.rng.choice(ONSETS) + self.rng.choice(NUCLEI) for _ in range(pairs))
            if self.rng.random() < 0.5:
                word = word[: self.rng.randint(3, len(word))]
            if word not in self.banned:
                return word


def render_chat(user: str, assistant: str) -> str:
    return f"<|user|>{user}<|end|><|assistant|>{assistant}<|end|>"  # what CHAT_TEMPLATE renders


def pretraining_document(words: Words, rng: random.Random) -> str:
    """Plain-text word games; about a quarter of documents are chat turns for every game but reversal, so the
    base model knows the chat protocol and knows reversal, but has never reversed a word in chat form."""
    if rng.random() < 0.25:
        w, k = words(), rng.random()
        if k < 0.3:
            return render_chat(f"Please write the word {w} in capital letters.", w.upper())
        if k < 0.55:
            return render_chat(f"Please spell the word {w}.", " ".join(w))
        if k < 0.8:
            return render_chat(f"How many letters does the word {w} have?", str(len(w)))
        return render_chat(f"Please say the word {w} twice.", f"{w} {w}")

    def game() -> str:
        w, k = words(), rng.random()
        if k < 0.45:
            return f"the word {w} backwards is {w[::-1]}."
        if k < 0.6:
            return f"{w} in capitals is {w.upper()}."
        if k < 0.75:
            return f"{w} spelled out is {' '.join(w)}."
        if k < 0.88:
            return f"{w} has {len(w)} letters."
        return f"say {w} twice: {w} {w}."

    return " ".join(game() for _ in range(rng.randint(2, 5)))


def pretrain(tok, banned: set[str], steps: int, seq: int, batch: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    words, rng = Words(seed + 1, banned), random.Random(seed + 2)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                      tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, betas=(0.9, 0.95))
    start, warmup = time.time(), min(100, steps // 10 + 1)
    for step in range(steps):
        scale = min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for group in opt.param_groups:
            group["lr"] = 3e-3 * scale
        rows = []
        for _ in range(batch):
            ids: list[int] = []
            while len(ids) < seq:
                ids += tok(pretraining_document(words, rng), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            rows.append(ids[:seq])
        x = torch.tensor(rows)
        loss = model(input_ids=x, labels=x, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        if step % 250 == 0 or step == steps - 1:
            print(f"step {step:5d}  loss {loss.item():.4f}  {time.time() - start:6.0f}s", flush=True)
    return model, float(loss.item()), time.time() - start


@torch.no_grad()
def prose_reversal_accuracy(model, tok, words: list[str]) -> float:
    """The base model's skill in its own (prose) format, on words it never saw."""
    model.eval()
    right = 0
    for w in words:
        ids = torch.tensor([tok(f"the word {w} backwards is ", add_special_tokens=False)["input_ids"]])
        out = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
        right += tok.decode(out[0, ids.shape[1]:]).split(".")[0] == w[::-1]
    return right / len(words)


def chat_record(word: str) -> dict:
    return {"messages": [{"role": "user", "content": f"Please write the word {word} backwards."},
                         {"role": "assistant", "content": word[::-1]}]}


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--steps", type=int, default=2500)
    ap.add_argument("--quick", action="store_true", help="a few steps and little data: checks the pipeline only")
    args = ap.parse_args()
    steps = 5 if args.quick else args.steps
    torch.set_num_threads(2)  # the shipped weights were built with 2 threads; results depend on it

    held_out_gen, eval_words = Words(7), set()
    while len(eval_words) < (10 if args.quick else 100):
        eval_words.add(held_out_gen())
    train_gen = Words(11, eval_words)
    train_words = [train_gen() for _ in range(50 if args.quick else 2000)]

    base = args.out / "tiny-base"
    base.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(base)
    model, loss, seconds = pretrain(tok, eval_words, steps, seq=128, batch=32 if not args.quick else 4, seed=0)
    model.save_pretrained(base, safe_serialization=True)
    accuracy = prose_reversal_accuracy(model, tok, sorted(eval_words))
    write_jsonl(args.out / "reverse" / "train.jsonl", [chat_record(w) for w in train_words])
    write_jsonl(args.out / "reverse" / "eval.jsonl", [chat_record(w) for w in sorted(eval_words)])
    digest = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(base.glob("*.safetensors"))}
    build = {"steps": steps, "final_loss": round(loss, 4), "seconds": round(seconds), "threads": 2,
             "torch": torch.__version__, "prose_reversal_accuracy_on_eval_words": accuracy, "sha256": digest}
    (base / "BUILD.json").write_text(json.dumps(build, indent=2) + "\n")
    print(json.dumps(build, indent=2))


if __name__ == "__main__":
    main()
