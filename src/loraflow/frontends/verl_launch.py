"""How a verl launch is recognised and where its config comes from: verl's own entry points, its recipes, and a
verl-based project's own trainer started with verl's Hydra keys; `--config-path/--config-name` (Hydra's flags).
Split from verl.py, which reads the settings."""

from __future__ import annotations

from pathlib import Path

from loraflow.frontends import easyr1, verl_megatron
from loraflow.frontends.common import Draft, load_mapping
from loraflow.frontends.dotlist import flatten

_HYDRA_FLAGS = {"--config-path": "config-path", "-cp": "config-path", "--config-name": "config-name",
                "-cn": "config-name"}


def ppo_overrides(positionals) -> bool:
    """Two or more Hydra overrides of verl's actor_rollout_ref section: a launch of verl's PPO trainer, whatever
    module starts it. verl-based projects (rllm, agent and search RL repos) run their own `-m pkg.train_x` or
    `python main.py` that composes verl's ppo_trainer.yaml and hands it to verl's RayPPOTrainer; no other framework
    names that section."""
    return sum(p.lstrip("+~").startswith("actor_rollout_ref.") and "=" in p for p in positionals) >= 2


def recognise(view) -> bool:
    # `-m verl.trainer.main_ppo`, a recipe of verl's (`-m recipe.dapo.main_dapo`), or a project's own trainer, each
    # with verl's Hydra keys.
    if view.runs("verl") or view.dotted.startswith("verl.") or easyr1.launches(view.program, view.positionals):
        return True
    return ppo_overrides(view.positionals) or (view.dotted.startswith("recipe.") and any(
        p.lstrip("+").startswith("actor_rollout_ref.") for p in view.positionals))


# The keys a recipe's own config adds to ppo_trainer.yaml (its `defaults: [ppo_trainer, _self_]`): DAPO's
# recipe/dapo/config/dapo_trainer.yaml (volcengine/verl v0.3.1 onwards, and its forks' recipe/dapo/src/config) adds
# the generation batch, the overlong penalty and the group filter, none of which touches the actor's memory or its
# adapter; they are the recipe's, not keys verl lacks.
_RECIPE_KEYS = {"dapo": frozenset({
    "data.gen_batch_size", "reward_model.overlong_buffer.enable", "reward_model.overlong_buffer.len",
    "reward_model.overlong_buffer.penalty_factor", "reward_model.overlong_buffer.log", "algorithm.filter_groups.enable",
    "algorithm.filter_groups.metric", "algorithm.filter_groups.max_num_gen_batches"}),
    # The split-placement recipes (recipe/one_step_off_policy, recipe/fully_async_policy, v0.5.0 onwards) set
    # actor_rollout_ref.hybrid_engine=False and give the rollout engine its own pool of GPUs.
    "one_step_off_policy": frozenset({"rollout.nnodes", "rollout.n_gpus_per_node"}),
    # fully_async_policy's scripts also pace the rollouter and its staleness (async_training.*).
    "fully_async_policy": frozenset({"rollout.nnodes", "rollout.n_gpus_per_node", "rollout.total_rollout_steps",
                                     "rollout.test_freq", "async_training.staleness_threshold",
                                     "async_training.trigger_parameter_sync_step", "async_training.require_batches"})}


def program_parts(program: str) -> list[str]:
    """A launched program as module parts, whether given as a path or a module (`verl/trainer/main_ppo.py` and
    `verl.trainer.main_ppo` both give [verl, trainer, main_ppo])."""
    return program.replace("/", ".").removesuffix(".py").split(".")


def recipe_keys(program: str) -> frozenset[str]:
    """The keys the recipe a launch runs adds to main_ppo's config (`-m recipe.dapo.main_dapo`)."""
    parts = program_parts(program)
    if "recipe" not in parts:
        return frozenset()
    return frozenset().union(*(_RECIPE_KEYS.get(p, frozenset()) for p in parts[parts.index("recipe") + 1:]))


def own_trainer(program: str, draft: Draft) -> None:
    """A trainer that is neither verl's nor one of its recipes: its own code may change what verl's workers do (a
    second adapter per agent, its own rollout loop), which the launch does not show."""
    if program.startswith("recipe.") or ".recipe." in program:
        return
    draft.unknown.append(f"{program}: a verl-based project's own trainer, read as verl's main_ppo with the same "
                         "overrides; what its own code changes is not seen")


def config_file(others: list[str], draft: Draft, own_configs: frozenset[str]) -> tuple[dict, list[str]]:
    """`--config-path DIR --config-name NAME` (Hydra's own flags): the named YAML as the base, when it is here
    (own_configs: the names of verl's own configs, read as verl's defaults when absent)."""
    given: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(others):
        name, eq, value = others[i].partition("=")
        if name in _HYDRA_FLAGS:
            if not eq and i + 1 < len(others):
                value, i = others[i + 1], i + 1
            given[_HYDRA_FLAGS[name]] = value
        else:
            rest.append(others[i])
        i += 1
    if "config-name" not in given:
        return {}, rest
    name = given["config-name"] if given["config-name"].endswith(".yaml") else given["config-name"] + ".yaml"
    path = Path(given.get("config-path", ".")) / name
    if not path.is_file():
        megatron = verl_megatron.config_defaults(given["config-name"])
        if Path(name).stem not in own_configs:  # the user's own config: its keys are unseen (exit 1)
            draft.unknown.append(f"--config-name {given['config-name']}: {path} is not here, so read as verl's "
                                 "defaults and the overrides")
            return megatron, rest
        draft.note(f"--config-name {given['config-name']}: {path} is not here; " + (
            "read as verl's own Megatron trainer config" if megatron else "its keys are read as verl's defaults"))
        return megatron, rest
    return {k: (v, f"{path.name}: {k}") for k, v in flatten(load_mapping(path, "verl config")).items()
            if k not in ("defaults", "hydra")}, rest


def split_placement(program: str, options: dict, draft: Draft) -> None:
    """hybrid_engine=False outside the split-placement recipes: verl's RayPPOTrainer asserts a hybrid engine
    (`assert self.hybrid_engine, "Currently, only support hybrid engine"`, verl/trainer/ppo/ray_trainer.py), so
    main_ppo stops at start-up; only recipe/one_step_off_policy and recipe/fully_async_policy run the engine apart."""
    value, where = options.get("actor_rollout_ref.hybrid_engine", (True, ""))
    parts = program_parts(program)
    if str(value).lower() == "false" and not {"one_step_off_policy", "fully_async_policy"} & set(parts):
        draft.stop(f"{where}: verl's RayPPOTrainer asserts a hybrid engine (\"Currently, only support "
                   "hybrid engine\", ray_trainer.py), so this launch stops at start-up unless its trainer "
                   "is a split-placement recipe's (one_step_off_policy, fully_async_policy)")
