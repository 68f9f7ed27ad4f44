"""The rules of weights that are not where the code reading them expects: ZeRO-3's zero.Init leaves every weight
an empty placeholder from the moment the model is built, and sharded or offloaded weights are whole on the compute
device only inside the wrapped module's forward. Code that reads them anywhere else (an adapter's initialization,
quantization at load, a submodule called directly) sees shape [0], a freed storage, or a CPU tensor."""

from __future__ import annotations

from loraflow.rules.combination import Combination
from loraflow.rules.refusals import PISSA_ZERO3, ZERO3_DEVICE_MAP, ZERO3_QUANTIZED_LOAD
from loraflow.rules.rule import Rule, older, register
from loraflow.rules.signs import Evidence, LogSigns, Message

ADAPTER_READ_FIXED = {"prompt": "0.11.0", "svd": "0.12.0", "parameters": "0.21.0"}
"""The first PEFT release that gathers (or reads the ZeRO-3 shape of) what each kind of adapter creation reads:
prompt tuning's vocabulary lookup (PR #1591; the embedding search by ds_shape came in 0.6.0, PR #1000), the
SVD/QR initializations PiSSA, OLoRA, CorDA and LoftQ (PR #1887, with the wrapper recursion fix PR #1892),
LoRA on nn.Parameter targets (PR #3576)."""


def _reads_partitioned(s: Combination) -> bool:
    kind = s.adapter_reads_base
    return s.zero3 and kind is not None and older(s, "peft", ADAPTER_READ_FIXED[kind])


register(Rule(
    id="zero3-init-adapter-read",
    title="PEFT creates an adapter from base weights ZeRO-3 has already partitioned",
    verdict="error",
    impact="crash",
    conditions="DeepSpeed ZeRO-3 with zero.Init (the model built partitioned: from_pretrained under ZeRO-3) and an "
               "adapter whose creation reads the base weights: an SVD/QR initialization (PiSSA, OLoRA, CorDA, LoftQ) "
               "with peft < 0.12, LoRA on nn.Parameter targets (target_parameters, fused MoE experts) with "
               "peft < 0.21, prompt tuning from the vocabulary with peft < 0.11",
    knobs=("zero_stage", "adapter_reads_base"),
    affected={"peft": "<0.21.0"},  # the last of ADAPTER_READ_FIXED
    boundaries={"peft": tuple(ADAPTER_READ_FIXED.values())},
    when=_reads_partitioned,
    cause=("Under zero.Init every weight is an empty placeholder of shape [0] from the moment the model is built; "
           "its values and real shape live in rank partitions until a gather. A PEFT release that reads the base "
           "weight while creating the adapter without gathering it decomposes, measures or indexes the placeholder: "
           "PiSSA's SVD and OLoRA's QR see a 1-D tensor, target_parameters reads param.shape[1] of a 1-D shape, "
           "prompt tuning looks its initial words up in a [0] embedding; before 0.12 PEFT's own wrapper created "
           "inside zero.Init also recursed on an attribute read before its __init__."),
    fix="Upgrade peft (0.12 for PiSSA/OLoRA/CorDA/LoftQ and the wrapper, 0.21 for target_parameters, 0.11 for "
        "prompt tuning): it gathers the weight for the read. Else use the default LoRA initialization, or ZeRO-2.",
    elsewhere="pip install -U peft; else init_lora_weights=True (no PiSSA/OLoRA) or ZeRO-2. PEFT gathers only where "
              "it sees ZeRO-3 through transformers' HfDeepSpeedConfig (the HF Trainer and accelerate keep one): a "
              "loop that enters deepspeed.zero.Init itself must keep one alive while get_peft_model runs, in every "
              "release (seen with peft 0.21.2: `linalg.svd: The input tensor A must have at least 2 dimensions`)",
    references=("https://github.com/huggingface/peft/pull/1887", "https://github.com/huggingface/peft/pull/1892",
                "https://github.com/huggingface/peft/pull/3576", "https://github.com/huggingface/peft/pull/1591",
                "https://github.com/huggingface/peft/pull/1000", "https://github.com/huggingface/peft/issues/2916",
                "https://github.com/huggingface/peft/issues/206",
                "https://github.com/huggingface/accelerate/issues/2886",
                "https://github.com/huggingface/transformers/issues/24445"),
    fixed_in="peft 0.21.0 (the last of them: target_parameters)",
    log=LogSigns(
        messages=(Message(r"linalg\.(svd|qr|eigh?): The input tensor A must have at least 2 dimensions", "shared",
                          "torch.linalg on a [0] placeholder: PEFT's PiSSA/CorDA (svd) or OLoRA (qr) init"),
                  Message(r"IndexError: tuple index out of range", "generic",
                          "peft ParamWrapper reading param.shape[1] of a partitioned parameter"),
                  Message(r"'weight' must be 2-D", "generic",
                          "F.embedding on a [0] word embedding: prompt tuning's initial words"),
                  PISSA_ZERO3,  # LLaMA-Factory's refusal of PiSSA initialized under ZeRO-3 (refusals.py)
                  Message(r"maximum recursion depth exceeded", "generic",
                          "PEFT's wrapper created inside zero.Init (peft < 0.12)")),
        frames=(Message(r"peft[/\\.]tuners[/\\.](lora[/\\.]layer\.py:(__init__|update_layer|_get_in_out_features|"
                        r"pissa_init|olora_init|corda_init|loftq_init)|prompt_tuning[/\\.]model\.py:__init__)$",
                        "shared"),
                Message(r"deepspeed[/\\.]runtime[/\\.]zero[/\\.]partition_parameters\.py:wrapper$", "generic")),
        evidence=(Evidence("peft_init_frames", 3, "the traceback runs through PEFT creating its adapter"),
                  Evidence("zero3", 2, "ZeRO-3 is in use"),
                  Evidence("dora_code", -4, "DoRA's own weight norm is in the traceback (rule dora-sharded-weight)")),
        prior=0.5,
        tells_apart="the error is raised while PEFT builds the adapter (get_peft_model, a LoRA layer's __init__ or "
                    "its initialization), not in a forward"),
))

QUANTIZED_ZERO_INIT_SKIPPED = "4.39.0"
"""transformers' from_pretrained stops building a quantized model under zero.Init (PR #29587, QLoRA + ZeRO-3)."""
QUANTIZED_SUBMODEL_ZERO_INIT_SKIPPED = "4.47.0"
"""...and _from_config does too, which image-text models use to build their towers (PR #34395)."""


def _quantized_under_zero_init(s: Combination) -> bool:
    if not (s.zero3 and s.quantization is not None):
        return False
    first = QUANTIZED_SUBMODEL_ZERO_INIT_SKIPPED if s.image_text else QUANTIZED_ZERO_INIT_SKIPPED
    return older(s, "transformers", first)


register(Rule(
    id="zero3-init-quantized-load",
    title="A bitsandbytes-quantized model loaded under ZeRO-3's zero.Init",
    verdict="error",
    impact="crash",
    conditions="a bitsandbytes 4-bit or 8-bit model loaded with DeepSpeed ZeRO-3 configured (zero.Init on), with "
               "transformers < 4.39 (every model), or < 4.47 for an image-text model, whose towers are built "
               "through _from_config",
    knobs=("quantization", "zero_stage"),
    affected={"transformers": f"<{QUANTIZED_SUBMODEL_ZERO_INIT_SKIPPED}"},
    boundaries={"transformers": (QUANTIZED_ZERO_INIT_SKIPPED,)},
    when=_quantized_under_zero_init,
    cause=("With ZeRO-3 configured, transformers builds the model inside deepspeed.zero.Init, which replaces every "
           "weight by a [0] placeholder as its module is created. bitsandbytes then quantizes while the checkpoint "
           "loads, writing full-size weights into those placeholders, or copying out of meta tensors the "
           "quantizer left behind: the load fails. transformers skips zero.Init for a quantized model since 4.39, "
           "and for the sub-models an image-text model builds with _from_config since 4.47."),
    fix="Upgrade transformers (4.39, or 4.47 for image-text models); or use ZeRO-2 for QLoRA; or load the base "
        "unquantized under ZeRO-3.",
    elsewhere="pip install -U transformers; else a ZeRO-2 config for QLoRA, or no quantization under ZeRO-3 "
              "(QLoRA + ZeRO-3 also needs bnb_4bit_quant_storage equal to the model dtype)",
    references=("https://github.com/huggingface/transformers/pull/29587",
                "https://github.com/huggingface/transformers/pull/34395",
                "https://github.com/huggingface/transformers/issues/34378",
                "https://github.com/axolotl-ai-cloud/axolotl/issues/1240",
                "https://github.com/2U1/Qwen-VL-Series-Finetune/issues/7",
                "https://github.com/bitsandbytes-foundation/bitsandbytes/issues/1249"),
    fixed_in="transformers 4.39.0 (4.47.0 for image-text models)",
    log=LogSigns(
        messages=(Message(r"Trying to set a tensor of shape torch\.Size\(\[[\d, ]+\]\) in \"\w+\" \(which has shape "
                          r"torch\.Size\(\[0\]\)\), this looks? incorrect", "shared",
                          "accelerate set_module_tensor_to_device: a checkpoint weight written into a zero.Init "
                          "placeholder while the quantizer loads"),
                  Message(r"Cannot copy out of meta tensor; no data!", "generic",
                          "a quantized sub-model built on meta under zero.Init, then moved"),
                  ZERO3_QUANTIZED_LOAD,  # LLaMA-Factory's refusal before transformers 4.39 (refusals.py)
                  ZERO3_DEVICE_MAP),  # transformers' refusal of the quantized load's device_map (refusals.py)
        # Neither fact decides alone: a 4-bit model whose device_map offloads weights meets meta tensors too, and
        # ZeRO-3 leaves [0] placeholders for PEFT to read (zero3-init-adapter-read); both together point here.
        evidence=(Evidence("quant4bit", 2, "a bitsandbytes-quantized model is loaded"),
                  Evidence("quant8bit", 2, "an 8-bit (LLM.int8) model is loaded"),
                  Evidence("zero3", 2, "ZeRO-3 is configured"),
                  Evidence("unsloth", -3, "Unsloth loads the model (rule unsloth-multi-gpu)")),
        prior=1.0,
        tells_apart="a full-size checkpoint weight set into a [0] placeholder while a quantized model loads with "
                    "ZeRO-3 configured"),
))
LOW_CPU_MEM_IGNORED = "4.51.0"
"""transformers' from_pretrained stops refusing low_cpu_mem_usage=True under ZeRO-3: it ignores the argument and only
a device_map is refused (modeling_utils.py of the 4.50.0 and 4.51.3 wheels)."""
ZERO3_DEVICE_MAP_ALONE = Message(ZERO3_DEVICE_MAP.pattern, "shared", ZERO3_DEVICE_MAP.raised_by)
"""The same refusal as this rule's own: the load's device_map is the cause, whatever made the script pass it."""


def _placed_under_zero3(s: Combination) -> bool:
    if not s.zero3 or s.device_map_load is None:
        return False
    return s.device_map_load == "device_map" or older(s, "transformers", LOW_CPU_MEM_IGNORED)


register(Rule(
    id="zero3-device-map-load",
    title="from_pretrained given a device_map while ZeRO-3 is configured",
    verdict="fix",
    impact="crash",
    conditions="DeepSpeed ZeRO-3 configured before the model loads (TrainingArguments(deepspeed=...), an accelerate "
               "ZeRO-3 config) and from_pretrained given a device_map (any value: 'auto', {'': local_rank}, a "
               "device), or low_cpu_mem_usage=True with transformers < 4.51",
    knobs=("device_map_load", "zero_stage"),
    boundaries={"transformers": (LOW_CPU_MEM_IGNORED,)},
    when=_placed_under_zero3,
    cause=("With ZeRO-3 configured, transformers builds the model partitioned (zero.Init) and leaves each weight's "
           "placement to the engine. A device_map asks accelerate's big-model loader to put whole weights on named "
           "devices instead, so from_pretrained refuses before it reads a weight (`DeepSpeed Zero-3 is not "
           "compatible with passing a device_map`). Before 4.51 low_cpu_mem_usage=True, which a device_map also "
           "turned on, was refused the same way. Every transformers release does this: the QLoRA and DDP recipes' "
           "device_map={'': local_rank} cannot be kept when the same script is launched with a ZeRO-3 config."),
    fix="loraflow never passes a device_map under ZeRO-3: the engine places the partitions.",
    remedy=lambda s: {"device_map_load": None},
    elsewhere="pass no device_map (and, before transformers 4.51, no low_cpu_mem_usage) when ZeRO-3 is on, e.g. "
              "device_map=None if is_deepspeed_zero3_enabled() else {'': local_rank}; or use ZeRO-2 where each "
              "rank must hold its own copy on its device",
    references=("https://github.com/hiyouga/LlamaFactory/issues/199",
                "https://github.com/OptimalScale/LMFlow/issues/620",
                "https://github.com/OptimalScale/LMFlow/issues/686",
                "https://github.com/huggingface/accelerate/issues/2543",
                "https://github.com/locuslab/open-unlearning/issues/38",
                "https://github.com/shibing624/MedicalGPT/issues/477",
                "https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/integrations/accelerate.py "
                "(check_and_set_device_map)"),
    fixed_in="design: ZeRO-3 places the weights itself",
    log=LogSigns(
        messages=(ZERO3_DEVICE_MAP_ALONE,),
        # A quantized load or Unsloth's loader passes the device_map for a reason of its own, which those rules name.
        evidence=(Evidence("quant4bit", -1, "a bitsandbytes model is loaded (rule zero3-init-quantized-load)"),
                  Evidence("quant8bit", -1, "an 8-bit model is loaded (rule zero3-init-quantized-load)"),
                  Evidence("unsloth", -3, "Unsloth loads the model (rule unsloth-multi-gpu)")),
        prior=1.0,
        tells_apart="transformers refuses the load's device_map (or low_cpu_mem_usage) before reading any weight"),
))

register(Rule(
    id="sharded-weights-outside-forward",
    title="Sharded or offloaded weights used outside the wrapped module's forward",
    verdict="error",
    impact="crash",
    conditions="FSDP or DeepSpeed ZeRO-3, and the trained model's weights used outside the forward of the module the "
               "engine wraps: a submodule called directly (an embedding looked up, a vision tower run while the "
               "inputs are prepared), or weights a framework moved to the CPU itself and did not bring back before a "
               "log-prob, save or sync pass",
    knobs=("weights_outside_forward",),
    when=lambda s: s.sharded_params and s.weights_outside_forward,
    cause=("A sharded engine makes a unit's weights whole, on the compute device, only around that unit's forward: "
           "FSDP's pre-forward unshard, ZeRO-3's fetch hooks, CPU offload's copy back. A submodule called on its "
           "own skips the hooks and reads a freed storage (FSDP: 'data is not allocated yet') or a [0] placeholder "
           "(ZeRO-3); weights a framework offloaded by hand and did not reload meet FSDP's check that they sit on "
           "the compute device, or a GPU input in the same matmul."),
    fix="Run every use of the weights through the wrapped module's forward (call the whole model, or register the "
        "method with FSDP's register_fsdp_forward_method), or gather them explicitly (summon_full_params, "
        "GatheredParameters); bring weights offloaded by hand back to the device before any pass that uses them.",
    elsewhere="compute embeddings or tower features inside the model's forward rather than in a data template or "
              "a helper; with verl-style manual offload, reload the actor (load_fsdp_model_to_gpu) before "
              "compute_log_prob, saving and engine syncs",
    references=("https://github.com/verl-project/verl/issues/3942", "https://github.com/verl-project/verl/issues/181",
                "https://github.com/verl-project/verl/issues/5390", "https://github.com/modelscope/ms-swift/issues/938",
                "https://github.com/pytorch/pytorch/blob/main/torch/distributed/fsdp/_flat_param.py "
                "(FlatParamHandle._check_on_compute_device)"),
    fixed_in="not a bug: the engine's contract",
    log=LogSigns(
        messages=(Message(r"The tensor has a non-zero number of elements, but its data is not allocated yet",
                          "shared", "c10 TensorImpl::data: a tensor whose storage was freed (FSDP after resharding)"),
                  Message(r"Expects tensor to be on the compute device", "own",
                          "torch/distributed/fsdp/_flat_param.py: FlatParamHandle._check_on_compute_device"),
                  Message(r"Expected all tensors to be on the same device, but found at least two devices, "
                          r"(cuda:\d+ and cpu|cpu and cuda:\d+)", "generic", "any op given CPU and GPU tensors"),
                  Message(r"Expected all tensors to be on the same device, but got \w+ is on (cpu, different from "
                          r"other tensors on cuda:\d+|cuda:\d+, different from other tensors on cpu)", "generic",
                          "any op given CPU and GPU tensors (the wording that names the argument)",
                          "torch>=2.6 (seen in 2.7 and 2.9 tracebacks)")),
        evidence=(Evidence("fsdp", 3, "FSDP frees a unit's unsharded storage after its forward", decisive=True),
                  Evidence("offload", 2, "weights are offloaded to the CPU"),
                  Evidence("zero3", 1, "ZeRO-3 is in use"),
                  Evidence("compile", -6, "torch.compile's fake tensors print the same storage error")),
        prior=1.0,
        tells_apart="FSDP's compute-device check, or a freed storage read by a submodule called outside the "
                    "wrapped forward"),
))


TRL_DPO_REF_PREPARED = "0.7.2"
"""TRL's DPOTrainer hands a separate reference model to DeepSpeed (_prepare_deepspeed) since 0.7.2 (PR #687); before,
accelerate's prepare_model left it unwrapped under ZeRO-3."""

register(Rule(
    id="zero3-model-outside-engine",
    title="A second model built under ZeRO-3's zero.Init never given to an engine",
    verdict="error",
    impact="crash",
    conditions="DeepSpeed ZeRO-3 with zero.Init on (from_pretrained under a ZeRO-3 config: the HF Trainer, "
               "accelerate's zero3_init_flag, an HfDeepSpeedConfig kept alive), and a model other than the trained "
               "one (a DPO reference, a distillation teacher, a reward model, a frozen text encoder) loaded then "
               "and called without deepspeed.initialize; TRL's DPOTrainer with its own ref_model before 0.7.2",
    knobs=("zero_stage", "model_outside_engine"),
    when=lambda s: s.zero3 and s.model_outside_engine,
    cause=("zero.Init partitions every model built while it is on, not only the one trained: each weight becomes a "
           "[0] placeholder whose values live across the ranks. Only a model given to deepspeed.initialize gets "
           "the hooks that gather a module's weights around its forward, so the other model's first call reads "
           "the placeholders: an embedding lookup fails with `'weight' must be 2-D`, a linear layer with a shape "
           "of 0."),
    fix="Give every model the step calls to DeepSpeed (deepspeed.initialize with an inference config, as TRL's "
        "prepare_deepspeed does for a reference or reward model), or build it outside zero.Init "
        "(deepspeed.zero.Init(enabled=False), or before the ZeRO-3 config exists); for a LoRA run, use the base "
        "with the adapter disabled as the reference instead of a second copy.",
    elsewhere="TRL >= 0.7.2 prepares DPO's ref_model itself; accelerate users: accelerator.prepare(teacher) or "
              "load it under `with deepspeed.zero.Init(enabled=False)`",
    references=("https://github.com/huggingface/trl/issues/669", "https://github.com/huggingface/trl/pull/687",
                "https://github.com/huggingface/transformers/issues/22705",
                "https://github.com/huggingface/diffusers/issues/1865",
                "https://github.com/FlyMyAI/flymyai-lora-trainer/issues/40"),
    fixed_in="not a bug: zero.Init's contract (TRL's DPOTrainer: 0.7.2)",
    log=LogSigns(
        messages=(Message(r"'weight' must be 2-D", "generic",
                          "torch/nn/functional.py embedding on a [0] placeholder: a model whose weights ZeRO-3 "
                          "partitioned and no engine gathers"),),
        evidence=(Evidence("second_model", 3, "a reference, teacher or reward model, or a frozen text encoder, runs "
                                              "in the step"),
                  Evidence("zero3", 2, "ZeRO-3 is in use"),
                  Evidence("peft_init_frames", -4, "PEFT is creating its adapter (rule zero3-init-adapter-read)")),
        prior=0.5,
        tells_apart="the [0] placeholder is met in the forward of a model other than the one trained"),
))


ACCELERATE_REFUSES_SPLIT = "0.22.0"
"""accelerate's prepare refuses any model whose device map has several entries in a distributed run from 0.22.0
(Accelerator.verify_device_map); 0.20.0 and 0.21 refused only an 8-bit model so spread, and before them DDP itself
refused a module whose parameters sit on several GPUs when given device_ids."""

register(Rule(
    id="device-map-split-distributed",
    title="A model spread over several GPUs by device_map, trained by several processes",
    verdict="fix",
    impact="crash",
    conditions="from_pretrained with device_map 'auto', 'balanced' or 'balanced_low_0' (or a map naming several "
               "devices) in a launch of several processes (torchrun, accelerate launch, deepspeed) under DDP or ZeRO "
               "stage 0-2: every process sees every GPU of the node, so each spreads its copy over all of them",
    knobs=("model_split", "world_size"),
    # Under FSDP and ZeRO-3's zero.Init transformers does not dispatch the model over devices at all (and under
    # ZeRO-3 refuses the device_map itself, a rule of its own): the spread is refused only under DDP and ZeRO-0/1/2.
    when=lambda s: (s.model_split and s.world_size > 1 and not s.zero3
                    and not (s.engine_spec.flat_params or s.engine_spec.dtensor_params)),
    cause=("device_map='auto' is naive model parallelism: one process holds the model with its layers placed on "
           "several GPUs. Data parallelism wants one whole copy per process on that process's GPU. accelerate's "
           "prepare refuses a model whose device map has more than one entry in any distributed mode (0.22.0 "
           "on; 0.20 and 0.21 refused only 8-bit models so spread), and DDP refuses a module whose parameters sit "
           "on several GPUs when it is given device_ids."),
    fix="loraflow loads each process's model on its own device (device_map {'': local rank}) and never spreads it "
        "over GPUs.",
    remedy=lambda s: {"model_split": False},
    elsewhere="in a multi-process launch pass device_map={'': PartialState().process_index} (or no device_map and "
              "let the trainer place it; under ZeRO-3 no device_map at all); keep device_map='auto' for one process "
              "(`python train.py`, --num_processes 1) when the model does not fit one GPU",
    references=("https://github.com/huggingface/transformers/issues/31557",
                "https://github.com/QwenLM/Qwen/pull/833", "https://github.com/QwenLM/Qwen/issues/900",
                "https://github.com/FreedomIntelligence/HuatuoGPT-II/issues/32",
                "https://github.com/pacman100/LLM-Workshop/issues/9",
                "https://github.com/huggingface/accelerate/blob/v0.22.0/src/accelerate/accelerator.py "
                "(prepare_model, verify_device_map)"),
    fixed_in="design: data parallelism needs a whole model per process",
    log=LogSigns(
        messages=(Message(r"You can't train a model that has been loaded with `?device_map='auto'`? in any "
                          r"distributed mode", "own", "accelerate/accelerator.py: prepare / prepare_model",
                          f"accelerate>={ACCELERATE_REFUSES_SPLIT}"),
                  Message(r"You can't train a model that has been loaded in 8-bit (or 4-bit )?precision on "
                          r"multiple devices in any distributed mode", "own", "accelerate/accelerator.py: "
                          "prepare_model", "accelerate>=0.20.0"),
                  Message(r"DistributedDataParallel device_ids and output_device arguments only work with "
                          r"single-device", "own", "torch/nn/parallel/distributed.py: DistributedDataParallel "
                          "given device_ids for a module on several devices")),
        prior=1.0,
        tells_apart="accelerate's refusal of a model with a device map in a distributed run"),
))
