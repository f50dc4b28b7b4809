"""mini-swe-agent, unchanged, through its Python API as its README shows (``DefaultAgent``,
``LitellmModel``, ``LocalEnvironment``, its own ``default.yaml``): bash actions as tool calls
against the rollout's proxy (litellm's ``openai/`` provider at ``OPENAI_BASE_URL``), commands
run in the work directory. Its cost tracking is told to ignore the model it does not price, and
litellm not to fetch its price list from GitHub (it falls back to its bundled copy only after a
failed connection). Prints the submission.

The task's system prompt is appended to mini-swe-agent's own system template (which states its
protocol) as a template variable, never parsed as a template itself; the conversation is its
task (``task_prompt.py``).

Environment: ``MINI_SWE_AGENT`` (the directory it is installed in, put first on ``sys.path``),
``ROLLOUT_AGENT_MODEL``, and ``ProgramHarness``'s."""

import os
import sys

import task_prompt

sys.path.insert(0, os.environ["MINI_SWE_AGENT"])
os.environ.update(
    {
        "MSWEA_COST_TRACKING": "ignore_errors",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "MSWEA_CONFIGURED": "true",
        "MSWEA_GLOBAL_CONFIG_DIR": os.path.abspath(".mini-swe-agent"),
    }
)

import yaml
from minisweagent import package_dir
from minisweagent.agents.default import DefaultAgent
from minisweagent.environments.local import LocalEnvironment
from minisweagent.models.litellm_model import LitellmModel

conversation = task_prompt.messages()
instructions = task_prompt.instructions(conversation)
with open(os.path.join(package_dir, "config", "default.yaml")) as f:
    config = yaml.safe_load(f)
if instructions:
    config["agent"]["system_template"] += "\n\n{{task_instructions}}"
model = LitellmModel(
    model_name=f"openai/{os.environ.get('ROLLOUT_AGENT_MODEL', 'rollout')}",
    model_kwargs={
        **config["model"].get("model_kwargs", {}),
        "api_base": os.environ["OPENAI_BASE_URL"],
        "api_key": os.environ["OPENAI_API_KEY"],
    },
    **{k: v for k, v in config["model"].items() if k != "model_kwargs"},
)
agent = DefaultAgent(
    model,
    LocalEnvironment(cwd=os.getcwd(), **config.get("environment", {})),
    **{**config["agent"], "step_limit": int(os.environ.get("MINI_SWE_AGENT_STEP_LIMIT", "30"))},
)
result = agent.run(task_prompt.prompt(conversation), task_instructions=instructions)
print(result.get("submission", result) if isinstance(result, dict) else result)
