"""The shared workload of benchmarks/peers.py and its three workers (plain PyTorch, TRL, loraflow).

The parent calls `prepare` once: a seeded Llama, a WordLevel tokenizer saved beside it, prompt/completion JSONL
files and one initial LoRA adapter. Each worker then runs in a fresh interpreter (`peers.py --worker VARIANT`), builds
its own training setup from those files, copies the initial adapter into its LoRA weights (so the three start from
the same adapter whatever each framework's initialisation does), and measures:

- the wall time of each optimizer step (the first is warm-up and not timed);
- one extra step after the timed ones, under FlopCounterMode (FLOPs) and a saved-tensors hook (bytes autograd keeps
  for backward, parameters excluded): after them, so neither slows a timed step;
- the first batch's input_ids and labels as a hash, the loss of every step, the peak RSS.

The initial adapter's B is small and random, not zero: with B = 0 every initialisation of A gives the base model's
loss, so equal first losses would prove nothing about the adapters. With B random the first loss depends on every
adapter weight, and equal first losses (to 1e-4) show the three variants start from the same weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch

SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": "all-linear"}
LR = 2e-4
IGNORE = -100


# -- the workload, made once by the parent ----------------------------------------------------------------------
def word_tokenizer(vocab_size: int, eos: bool = True):
    """A WordLevel tokenizer of `vocab_size` ids (the specials, then w0, w1, ...): any id decodes and encodes.
    `eos=False` declares no end-of-sequence token ("</s>" stays an ordinary word): a sampler that stops at the
    tokenizer's EOS then never stops early (benchmarks/grpo_step.py needs completions of one length)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update({f"w{i}": len(SPECIALS) + i for i in range(vocab_size - len(SPECIALS))})
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # No post-processor: nobody adds a BOS, and the EOS each variant appends to the completion is the only special
    # token in a sample (TRL appends the string "</s>", loraflow the id; the batch hash shows they agree).
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>" if eos else None, pad_token="<pad>")


def prepare(workdir: Path, model_shape: dict[str, Any], sizes: list[tuple[int, int]], rows_per_batch: int,
            dtype: str = "float32") -> dict[str, Any]:
    """Model + tokenizer in workdir/model (weights saved in `dtype`), data_SEQ.jsonl per sequence length with
    `rows_per_batch` batches of the largest batch asked at that length, initial_adapter.pt. Returns paths."""
    longest = max(seq for seq, _ in sizes)
    paths = prepare_model(workdir, model_shape, longest, dtype)
    vocab_size = model_shape["vocab_size"]
    batches: dict[int, int] = {}
    for seq, batch in sizes:
        batches[seq] = max(batches.get(seq, 0), batch)
    data = {seq: str(_write_rows(workdir / f"data_{seq}.jsonl", seq, vocab_size, batch * rows_per_batch))
            for seq, batch in batches.items()}
    return {**paths, "data": data}


def prepare_model(workdir: Path, model_shape: dict[str, Any], longest: int, dtype: str = "float32",
                  eos: bool = True) -> dict[str, Any]:
    """The seeded Llama and its word tokenizer in workdir/model, initial_adapter.pt beside it. `eos=False`: no
    EOS in the tokenizer or the model's (generation) config, so no sampler stops before its token limit."""
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # "Writing model shards" would clutter the report
    workdir.mkdir(parents=True, exist_ok=True)
    model_dir = workdir / "model"
    vocab_size = model_shape["vocab_size"]
    tokenizer = word_tokenizer(vocab_size, eos)
    torch.manual_seed(0)
    heads = model_shape["num_attention_heads"]
    config = LlamaConfig(hidden_size=model_shape["hidden_size"], num_hidden_layers=model_shape["num_hidden_layers"],
                         num_attention_heads=heads, num_key_value_heads=model_shape.get("num_key_value_heads", heads),
                         intermediate_size=model_shape["intermediate_size"], vocab_size=vocab_size,
                         max_position_embeddings=max(4096, longest),
                         tie_word_embeddings=model_shape.get("tie_word_embeddings", False),
                         rope_theta=model_shape.get("rope_theta", 10000.0), bos_token_id=1,
                         eos_token_id=2 if eos else None, pad_token_id=3)
    # Built where it will run: initialising a billion weights takes seconds on a GPU, a minute on a few cores.
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(config)
    model = model.to("cpu", getattr(torch, dtype))
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    adapter = workdir / "initial_adapter.pt"
    torch.save(_initial_adapter(model), adapter)  # after saving: PEFT injects its layers into `model`
    return {"model": str(model_dir), "adapter": str(adapter)}


def _write_rows(path: Path, seq: int, vocab_size: int, rows: int) -> Path:
    """`rows` copies of one row: seq/2 prompt words, seq/2 - 1 completion words and the EOS every variant appends,
    so a sample is exactly `seq` tokens (no truncation, no padding). Identical rows make every variant see the same
    batches whatever order its sampler draws them in."""
    gen = torch.Generator().manual_seed(1234)
    words = torch.randint(0, vocab_size - len(SPECIALS), (seq - 1,), generator=gen).tolist()
    prompt = " ".join(f"w{i}" for i in words[: seq // 2])
    # The leading space keeps TRL's prompt + completion concatenation on a word boundary.
    completion = " " + " ".join(f"w{i}" for i in words[seq // 2:])
    line = json.dumps({"prompt": prompt, "completion": completion})
    path.write_text("\n".join([line] * rows) + "\n")
    return path


def _initial_adapter(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    peft_model = get_peft_model(model, LoraConfig(**LORA, task_type="CAUSAL_LM"))
    state = {}
    gen = torch.Generator().manual_seed(1)
    for name, p in peft_model.named_parameters():
        if p.requires_grad:
            value = p.detach().to("cpu", torch.float32).clone()
            if "lora_B" in name:  # see the module docstring: B = 0 would make the first-loss check vacuous
                # 0.05: on the smoke model the first loss moves by 4e-3 relative from B = 0 (0.02 gave only 2e-4,
                # too close to the 1e-4 the parent checks)
                value = torch.randn(value.shape, generator=gen) * 0.05
            state[adapter_key(name)] = value
    return state


def adapter_key(name: str) -> str:
    """A LoRA parameter's name without wrapper prefixes, so PEFT, TRL and loraflow models map to one key."""
    for part in ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "base_model.model.", "_orig_mod."):
        name = name.replace(part, "")
    return name


def load_adapter(model: torch.nn.Module, path: str) -> int:
    """Copy the initial adapter into the model's trainable LoRA weights; every one must be matched."""
    state = torch.load(path)
    trainable = {adapter_key(n): p for n, p in model.named_parameters() if p.requires_grad}
    if set(trainable) != set(state):
        raise RuntimeError(f"trainable weights differ from the initial adapter: only in the model "
                           f"{sorted(set(trainable) - set(state))[:3]}, only in the adapter "
                           f"{sorted(set(state) - set(trainable))[:3]}")
    with torch.no_grad():
        for key, p in trainable.items():
            p.copy_(state[key].to(p.device, p.dtype))
    return len(state)


# -- measurement helpers ----------------------------------------------------------------------------------------
def batch_hash(input_ids: torch.Tensor, labels: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in (input_ids, labels):
        t = t.detach().to("cpu", torch.int64).contiguous()
        h.update(str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


class SavedBytes:
    """Bytes autograd keeps for backward: unique storages (by data pointer) of the tensors packed, parameters and
    views of them excluded. Under non-reentrant checkpointing torch's own hook packs the checkpointed layers' tensors
    (innermost hook wins), so only what is really kept between forward and backward is counted."""

    def __init__(self, model: torch.nn.Module):
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.storages: dict[int, int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, torch.nn.Parameter) and t.device.type != "meta":
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr and ptr not in self.params:
                self.storages[ptr] = storage.nbytes()
        return t

    @property
    def total(self) -> int:
        return sum(self.storages.values())


def flop_counter() -> Any:
    """FlopCounterMode that also counts the CPU SDPA kernel (torch counts only the CUDA ones), with the same formula
    (full, not causal, attention), and that counts grouped-query attention: transformers passes keys and values
    with fewer heads than the queries (enable_gqa) on CUDA, which torch before 2.13 refuses to count
    ("sdpa_flop_count: query/key/value shapes are incompatible"). Counted as the kernel computes it: every query
    head against its shared key/value head, the FLOPs of keys and values repeated to the query heads."""
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    aten = torch.ops.aten

    def grouped(formula, first):  # `first`: the position of the query among the op's arguments
        def count(*args, **kwargs):
            args = list(args)
            query = args[first]
            for i in (first + 1, first + 2):  # key, value: [batch, heads, seq, dim]
                if query.dim() == 4 and args[i].dim() == 4 and args[i].shape[1] != query.shape[1]:
                    shape = (args[i].shape[0], query.shape[1], *args[i].shape[2:])
                    args[i] = torch.empty(shape, device="meta", dtype=args[i].dtype)
            return formula(*args, **kwargs)

        count._get_raw = True  # the registry's formulas already take tensors: FlopCounterMode must not rewrap them
        return count

    def tensors_only(formula, count_args):  # the `.dtype` overloads pass out_dtype where the formula takes out_shape
        def count(*args, **kwargs):
            return formula(*args[:count_args], **kwargs)

        count._get_raw = True
        return count

    ops = {"_scaled_dot_product_efficient_attention": "_scaled_dot_product_efficient_attention",
           "_scaled_dot_product_flash_attention": "_scaled_dot_product_flash_attention",
           "_scaled_dot_product_cudnn_attention": "_scaled_dot_product_cudnn_attention",
           "_scaled_dot_product_flash_attention_for_cpu": "_scaled_dot_product_flash_attention"}
    extra = {}
    for op, counted_as in ops.items():
        for suffix, first in (("", 0), ("_backward", 1)):  # backward: grad_out comes before the query
            target, formula = getattr(aten, op + suffix, None), flop_registry.get(getattr(aten, counted_as + suffix))
            if target is not None and formula is not None:
                extra[target] = grouped(formula, first)
    # TRL's chunked log-probabilities call torch.addmm(..., out_dtype=torch.float32) on CUDA (aten.addmm.dtype):
    # torch's own formulas then fail with "addmm_flop() got multiple values for argument 'out_shape'".
    for op, count_args in (("addmm", 3), ("baddbmm", 3), ("bmm", 2)):
        extra[getattr(aten, op)] = tensors_only(flop_registry[getattr(aten, op)], count_args)
    return FlopCounterMode(display=False, custom_mapping=extra)


class Recorder:
    """What a worker reports: step times, losses, the first batch's hash, FLOPs and saved bytes of the measured
    step. `measuring` is the context of that extra step."""

    def __init__(self, spec: dict[str, Any]):
        self.spec, self.cuda = spec, spec["device"] == "cuda"
        self.times: list[float] = []
        self.losses: list[float] = []
        self.first_hash: str | None = None
        self.flops = 0
        self.saved = None
        self._t0 = 0.0
        self._stack: ExitStack | None = None
        self._counter = None
        self.training_rss_mb: float | None = None
        """Peak RSS over the training steps, taken before the measured step: FlopCounterMode and the saved-tensor
        hooks change what that step allocates."""

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def batch(self, input_ids: torch.Tensor, labels: torch.Tensor) -> None:
        if self.first_hash is None:
            self.first_hash = batch_hash(input_ids, labels)

    def step_begin(self, model: torch.nn.Module, step: int) -> None:
        """`step` counts from 0; steps 1..steps-1 are timed, step `steps` is measured."""
        if step == self.spec["steps"] and self.spec["measure"]:
            self.training_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            self._stack = ExitStack()
            self.saved = SavedBytes(model)
            self._counter = self._stack.enter_context(flop_counter())
            self._stack.enter_context(torch.autograd.graph.saved_tensors_hooks(self.saved.pack, lambda t: t))
        self.sync()
        self._t0 = time.perf_counter()

    def step_end(self, step: int) -> None:
        self.sync()
        elapsed = time.perf_counter() - self._t0
        if self._stack is not None:
            self._stack.close()
            self._stack = None
            self.flops = int(self._counter.get_total_flops())
        elif 1 <= step < self.spec["steps"]:
            self.times.append(elapsed)

    def total_steps(self) -> int:
        return self.spec["steps"] + (1 if self.spec["measure"] else 0)

    def result(self) -> dict[str, Any]:
        out = {"variant": self.spec["variant"], "step_times": self.times, "losses": self.losses,
               "first_batch_hash": self.first_hash, "flops": self.flops,
               "saved_bytes": self.saved.total if self.saved else 0,
               "peak_rss_mb": self.training_rss_mb or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               "first_loss": self.losses[0] if self.losses else None,
               "last_loss": self.losses[self.spec["steps"] - 1] if len(self.losses) >= self.spec["steps"] else None}
        if self.cuda:
            out["cuda_max_memory_mb"] = torch.cuda.max_memory_allocated() / 2**20
        return out


# -- the three workers -------------------------------------------------------------------------------------------
def _bf16(spec: dict[str, Any]) -> bool:
    """bf16-mixed: frozen weights in bf16, adapters and optimizer in fp32 (PEFT upcasts adapters by default), the
    forward under bf16 autocast; otherwise everything fp32."""
    return spec.get("precision", "fp32") == "bf16-mixed"


def _load_base(spec: dict[str, Any]):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.bfloat16 if _bf16(spec) else torch.float32
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=dtype)
    return model, AutoTokenizer.from_pretrained(spec["model"])


def run_plain(spec: dict[str, Any]) -> dict[str, Any]:
    """A hand-written loop: what someone writes with PEFT and torch alone."""
    from peft import LoraConfig, get_peft_model

    rec = Recorder(spec)
    model, tokenizer = _load_base(spec)
    if spec["checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    torch.manual_seed(0)
    model = get_peft_model(model, LoraConfig(**LORA, task_type="CAUSAL_LM"))
    load_adapter(model, spec["adapter"])
    model.to(spec["device"]).train()
    # weight_decay 0 as TRL's and loraflow's defaults (torch's AdamW default is 0.01).
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=0.0)
    rows = [json.loads(line) for line in Path(spec["data"]).read_text().splitlines()]
    ids, labels = [], []
    for row in rows[: spec["batch"]]:
        prompt = tokenizer(row["prompt"])["input_ids"]
        full = tokenizer(row["prompt"] + row["completion"])["input_ids"] + [tokenizer.eos_token_id]
        ids.append(full)
        labels.append([IGNORE] * len(prompt) + full[len(prompt):])
    input_ids = torch.tensor(ids, device=spec["device"])
    label_ids = torch.tensor(labels, device=spec["device"])
    mask = torch.ones_like(input_ids)
    for step in range(rec.total_steps()):
        rec.step_begin(model, step)
        rec.batch(input_ids, label_ids)
        with torch.autocast(spec["device"], dtype=torch.bfloat16, enabled=_bf16(spec)):
            loss = model(input_ids=input_ids, attention_mask=mask, labels=label_ids, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        rec.losses.append(float(loss.detach()))
        rec.step_end(step)
    return rec.result()


def run_trl(spec: dict[str, Any]) -> dict[str, Any]:
    """TRL's SFTTrainer with a PEFT LoRA config, completion-only loss, steps timed by a callback."""
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    rec = Recorder(spec)
    model, tokenizer = _load_base(spec)

    class Timing(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            rec.step_begin(trainer.model, state.global_step)

        def on_step_end(self, args, state, control, **kwargs):
            rec.step_end(state.global_step - 1)

    class Recording(SFTTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            rec.batch(inputs["input_ids"], inputs["labels"])
            out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            rec.losses.append(float((out[0] if return_outputs else out).detach()))
            return out

    args = SFTConfig(output_dir=spec["run_dir"], max_steps=rec.total_steps(), per_device_train_batch_size=spec["batch"],
                     gradient_accumulation_steps=1, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
                     weight_decay=0.0, optim="adamw_torch", max_grad_norm=1.0, report_to="none", logging_steps=10**6,
                     save_strategy="no", eval_strategy="no", disable_tqdm=True, completion_only_loss=True,
                     packing=False, max_length=spec["seq"], gradient_checkpointing=spec["checkpointing"],
                     gradient_checkpointing_kwargs={"use_reentrant": False}, dataloader_num_workers=0, seed=0,
                     use_cpu=spec["device"] == "cpu", bf16=_bf16(spec), fp16=False)
    dataset = load_dataset("json", data_files=spec["data"], split="train")
    torch.manual_seed(0)
    trainer = Recording(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                        peft_config=LoraConfig(**LORA, task_type="CAUSAL_LM"), callbacks=[Timing()])
    load_adapter(trainer.model, spec["adapter"])  # before train(): the optimizer is built there
    trainer.train()
    return rec.result()


def run_loraflow(spec: dict[str, Any]) -> dict[str, Any]:
    """loraflow's own trainer, built by pipeline.build_run as `loraflow train sft` builds it, driven one
    Trainer.optimizer_step at a time (the call its loop makes)."""
    from loraflow.config import load_config
    from loraflow.environment import detect_environment
    from loraflow.run.pipeline import build_run

    rec = Recorder(spec)
    run_dir = Path(spec["run_dir"])
    # Explicit values for what this workload fixes; everything else is loraflow's default, as a user gets it
    # (`--loraflow-set KEY=VALUE` overrides, e.g. train.logits=full).
    config = load_config(overrides=spec.get("loraflow_overrides") or None, base={
        "stage": "sft",
        "model": {"path": spec["model"]},
        "adapter": {"method": "lora", "rank": LORA["r"], "alpha": LORA["lora_alpha"], "dropout": 0.0,
                    "target_modules": ["all-linear"]},
        "checkpointing": {"enabled": spec["checkpointing"]},
        "precision": {"mode": spec.get("precision", "fp32")},
        "data": {"train": spec["data"], "eval": None, "format": "prompt_completion", "max_length": spec["seq"]},
        "train": {"seed": 0, "micro_batch_size": spec["batch"], "gradient_accumulation_steps": 1,
                  "max_steps": rec.total_steps(), "learning_rate": LR, "weight_decay": 0.0, "warmup_steps": 0,
                  "schedule": "constant", "max_grad_norm": 1.0},
        "output": {"dir": str(run_dir), "tensorboard": False, "progress_bar": False, "save_every_steps": 0,
                   "log_every_steps": 10**6},
    })
    run = build_run(config, detect_environment(), run_dir,
                    adjust_model=lambda model: load_adapter(model, spec["adapter"]))
    trainer = run.trainer
    collate = trainer.hooks.collate

    def recording_collate(rows, pad_id):  # the batch exactly as the trainer builds it
        batch = collate(rows, pad_id)
        rec.batch(batch["input_ids"], batch["labels"])
        return batch

    trainer.hooks.collate = recording_collate
    for step in range(rec.total_steps()):
        rec.step_begin(trainer.model, step)
        stats = trainer.optimizer_step(None)
        rec.losses.append(float(stats["loss"]))
        rec.step_end(step)
    return rec.result()


VARIANTS = {"plain": run_plain, "trl": run_trl, "loraflow": run_loraflow}


@contextmanager
def quiet_libraries():
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    logging.getLogger("loraflow").setLevel(logging.WARNING)
    yield


def run_worker(variant: str, spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    spec["variant"] = variant
    with quiet_libraries():
        result = VARIANTS[variant](spec)
    Path(out_path).write_text(json.dumps(result))
