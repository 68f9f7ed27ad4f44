"""A sweep of users' multi-node and cluster launches (SLURM batch scripts, srun/mpirun, DeepSpeed hostfiles,
accelerate over several machines, LLaMA-Factory/ms-swift NNODES, verl on SLURM): the process counts it found misread.
Each input is a short synthetic script of the same shape; the comment names the public source that showed the class
(SLURM jobs found by exact-string search carry no repository name; they are described by what they run)."""

from __future__ import annotations

import shlex

from loraflow.frontends import from_command
from loraflow.frontends.shell import command_from_script


def _script(tmp_path, text: str, name: str = "job.sh"):
    script = tmp_path / name
    script.write_text(text)
    return from_command(["bash", str(script)], {})


def _check(line: str):
    return from_command(shlex.split(line), {})


# A SLURM LoRA job (llama-moe style `smoe/entrypoint/cpt_lora.py`) and a TRL SFTTrainer job: `#SBATCH --nodes=6
# --gres=gpu:4`, then `srun torchrun --nnodes=$SLURM_NNODES --nproc-per-node=$SLURM_GPUS_ON_NODE`. sbatch puts the
# directives' counts in the job's environment (sbatch(1) OUTPUT ENVIRONMENT VARIABLES), so the count is visible.
def test_sbatch_directives_give_the_slurm_variables_a_launch_line_uses(tmp_path):
    result = _script(tmp_path, "#!/bin/bash\n#SBATCH --job-name=x\n#SBATCH --nodes=6\n#SBATCH --ntasks-per-node=1\n"
                               "#SBATCH --gres=gpu:a100:4   # per node\nexport NPROC=$SLURM_GPUS_ON_NODE\n"
                               "srun torchrun --nnodes=$SLURM_NNODES --nproc-per-node=$NPROC --rdzv-backend=c10d "
                               "train.py --use_peft --lora_r 8\n")
    assert result.setup.world_size == 24
    # A directive left to submission (`sbatch --nodes=2 job.sh`) stays unknown: nothing is invented.
    bare = _script(tmp_path, "#!/bin/bash\n#SBATCH --time=1:00:00\nsrun torchrun --nnodes=$SLURM_NNODES "
                             "--nproc_per_node=$SLURM_GPUS_PER_NODE train.py --use_peft\n", "bare.sh")
    assert "world_size" in bare.unsure


# CSCS's TRL tutorial (`ACCEL_PROCS=$(( $SLURM_NNODES * $SLURM_GPUS_PER_NODE ))`) and a SLURM job with
# `--num_processes $((4 * $COUNT_NODE))`: arithmetic on names the script does not set read as 0, so the count fell
# back to the config file's, or to "one process, assumed". It is not visible: both are evaluated.
def test_arithmetic_on_unset_names_is_an_unknown_count_not_zero(tmp_path):
    argv = command_from_script(str(_write(tmp_path, "N=$((4 * $COUNT_NODE))\naccelerate launch --num_processes $N "
                                                    "--multi_gpu train.py --use_peft\n")))
    assert argv[argv.index("--num_processes") + 1] == "$((4*$COUNT_NODE))"
    result = _script(tmp_path, "accelerate launch --num_processes $((4 * $COUNT_NODE)) --num_machines $COUNT_NODE "
                               "--machine_rank $SLURM_PROCID train.py --use_peft\n")
    assert "world_size" in result.unsure
    # With the directive the same expression has a value.
    known = _script(tmp_path, "#SBATCH -N 2\n#SBATCH --gpus-per-node=4\naccelerate launch --num_processes "
                              "$(($SLURM_NNODES * $SLURM_GPUS_PER_NODE)) train.py --use_peft\n", "known.sh")
    assert known.setup.world_size == 8


def _write(tmp_path, text: str):
    path = tmp_path / "w.sh"
    path.write_text(text)
    return path


# A mup demo SLURM job: `WORLD_SIZE=$((${SLURM_JOB_NUM_NODES:=1} * $SLURM_GPUS_ON_NODE))` and
# `training_script=${training_script:="mup_demo/train.py"}`: bash's `:=` default (and `-`) gives the default as `:-`
# does; the program was lost (empty), and `"$@"` of a script run without arguments is no word at all.
def test_assign_default_expansions_and_empty_positional_list(tmp_path):
    argv = command_from_script(str(_write(tmp_path, '#SBATCH --gres=gpu:2\nscript=${script:="train.py"}\n'
                                                    "W=$((${SLURM_JOB_NUM_NODES:=1} * $SLURM_GPUS_ON_NODE))\n"
                                                    'accelerate launch --num_processes $W $script "$@"\n')))
    assert argv[-3:] == ["--num_processes", "2", "train.py"]


# A TRL GRPO SLURM job: `LAUNCHER="accelerate launch ... --main_process_ip "$MASTER_ADDR" ..."`, then
# `srun --jobid $SLURM_JOB_ID bash -c "$LAUNCHER $TRAIN_CMD"`: the string after `bash -c` is the command (it was
# read as a program named `bash`), and a value joining quoted and bare parts is one value, as in bash.
def test_srun_bash_c_string_and_a_value_of_joined_quotes(tmp_path):
    result = _script(tmp_path, 'TRAIN="grpo.py --use_peft --lora_r 16 --bf16"\nN=2\n'
                               'L="accelerate launch --multi_gpu --num_machines $N --num_processes $((N*8)) '
                               '--main_process_ip "$MASTER_ADDR" --machine_rank $SLURM_PROCID"\n'
                               'srun --jobid $SLURM_JOB_ID bash -c "$L $TRAIN"\n')
    assert result.setup.world_size == 16 and result.setup.adapter == "lora"


# A LoRA job on a SLURM cluster (`llama.train --do-lora`): `#SBATCH --ntasks-per-node=4` and `srun python -m ...`,
# one process per task. It was read as `python (one process)`; srun(1) starts its program once per task.
def test_srun_python_counts_the_tasks_it_starts(tmp_path):
    full = _script(tmp_path, "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n"
                             "srun --cpu_bind=v python -u train.py --use_peft\n")
    assert full.setup.world_size == 8
    assert _check("srun -N 2 --ntasks-per-node=4 python train.py --use_peft").setup.world_size == 8
    assert _check("srun -n 8 python train.py --use_peft").setup.world_size == 8
    # The node count left to submission: at least one node's tasks.
    lower = _script(tmp_path, "#SBATCH --ntasks-per-node=4\nsrun python train.py --use_peft\n", "lower.sh")
    assert lower.setup.world_size == 4
    # No count anywhere: not "one process", a question.
    assert "world_size" in _check("srun python train.py --use_peft").unsure
    # Before torchrun, srun's tasks are one launcher per node: the count stays torchrun's.
    assert _check("srun -N 2 --ntasks-per-node=1 torchrun --nnodes 2 --nproc_per_node 4 train.py "
                  "--use_peft").setup.world_size == 8
    assert "world_size" in _check("mpirun python train.py --use_peft").unsure
    assert _check("mpirun -np 4 python train.py --use_peft").setup.world_size == 4


# LLaMA-Factory's distributed docs: `FORCE_TORCHRUN=1 NNODES=2 RANK=0 ... llamafactory-cli train x.yaml` (no
# NPROC_PER_NODE: one per device on each node, launcher.py) was "one process or several"; ms-swift with NNODES and no
# NPROC_PER_NODE runs torchrun's default one process per node (swift/cli/main.py use_torchrun).
def test_nnodes_alone_means_several_processes():
    lmf = _check("env FORCE_TORCHRUN=1 NNODES=2 NODE_RANK=0 llamafactory-cli train x_lora_sft.yaml")
    assert lmf.setup.world_size == 2 and "world_size" not in lmf.unsure
    assert _check("env NNODES=2 NODE_RANK=0 swift sft --model q --train_type lora").setup.world_size == 2


# Multi-node launches whose per-node count is not visible: `torchrun --nnodes 2 --nproc_per_node $G`,
# `accelerate launch --num_machines 2` (--num_processes is the total over machines: accelerate/commands/launch.py),
# `deepspeed --num_nodes 2 --hostfile h` and torchrun's `--nproc_per_node gpu`: at least one process per node, never
# "one process".
def test_node_counts_bound_the_world_when_per_node_counts_are_hidden():
    assert _check("torchrun --nnodes 2 --nproc_per_node $G train.py --use_peft").setup.world_size == 2
    assert _check("accelerate launch --num_machines 2 --num_processes $N train.py --use_peft").setup.world_size == 2
    assert _check("deepspeed --hostfile h --num_nodes 2 train.py --use_peft").setup.world_size == 2
    assert "world_size" in _check("torchrun --nproc_per_node gpu train.py --use_peft").unsure
    hidden_nodes = _check("torchrun --nnodes $SLURM_NNODES --nproc_per_node 8 train.py --use_peft")
    assert hidden_nodes.setup.world_size == 8 and "not visible" in hidden_nodes.sources["world_size"]


# ms-swift's multi-node DeepSpeed example: `deepspeed --hostfile=host.txt swift/cli/sft.py`: the hostfile's
# `host slots=N` lines place the processes (deepspeed/launcher/runner.py fetch_hostfile).
def test_a_deepspeed_hostfile_on_disk_gives_its_slots(tmp_path):
    (tmp_path / "host.txt").write_text("worker-0 slots=4\nworker-1 slots=4  # second node\n")
    result = _script(tmp_path, f"deepspeed --hostfile={tmp_path / 'host.txt'} train.py --use_peft --deepspeed "
                               "ds_z2.json\n")
    assert result.setup.world_size == 8


# verl GRPO jobs on SLURM: `trainer.nnodes=$SLURM_NNODES trainer.n_gpus_per_node=8` stopped check with "not a
# number"; the node count is not visible, the GPUs per node bound the world from below.
def test_verl_nnodes_from_the_job_is_not_an_error():
    result = _check("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo trainer.n_gpus_per_node=8 "
                    "trainer.nnodes=$SLURM_NNODES actor_rollout_ref.model.path=m")
    assert result.setup.world_size == 8 and "not visible" in result.sources["world_size"]


# open-instruct style scripts print `accelerate launch -h` before the run, and scripts build the line in a variable
# then `eval $header`: the help line is not the run, and eval runs the line after it.
def test_help_lines_are_skipped_and_eval_runs_its_line(tmp_path):
    result = _script(tmp_path, "accelerate launch -h\naccelerate launch --num_processes 2 finetune.py --use_peft\n")
    assert result.setup.world_size == 2
    built = _script(tmp_path, 'H="torchrun --nproc_per_node=2 train.py --use_peft"\necho "$H"\neval $H\n', "e.sh")
    assert built.setup.world_size == 2
