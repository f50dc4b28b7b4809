"""rollout_ray: RL rollouts with the verifiers v1 lifecycle, on Ray.

Importing this package never imports ``ray``: the lifecycle core is plain asyncio, and the
Ray-backed names (``RolloutActor``, ``RuntimeActor``, ...) load on first access.
"""

# Only the public names and private ones: no ``from __future__ import annotations`` (it binds
# ``annotations``), and the modules this file uses are imported under private names.
import importlib as _importlib
import logging as _logging

# The record
from ._record.trace import TRACE_VERSION as TRACE_VERSION
from ._record.trace import AgentInfo as AgentInfo
from ._record.trace import AgentSpan as AgentSpan
from ._record.graph import Branch as Branch
from ._record.trace import ErrorRecord as ErrorRecord
from ._record.trace import ErrorRecord as Error  # noqa: F401 - its former name, in __all__ by _ADVANCED
from ._record.trace import InterceptRecord as InterceptRecord
from ._record.trace import MessageNode as MessageNode
from ._record.trace import ModelCall as ModelCall
from ._record.trace import Reward as Reward
from ._record.trace import RuntimeInfo as RuntimeInfo
from ._record.trace import TimeSpan as TimeSpan
from ._record.trace import TimeSplit as TimeSplit
from ._record.trace import Timing as Timing
from ._record.trace import Trace as Trace
from ._record.trace import ToolCallRecord as ToolCallRecord
from ._record.trace import TraceTask as TraceTask
from ._record.agent_branches import agent_messages as agent_messages
from ._record.agent_branches import agent_rewards as agent_rewards
from ._record.agent_branches import agent_sequences as agent_sequences
from ._record.agent_branches import branch_agents as branch_agents
from ._record.trace import UserTurn as UserTurn
from ._record.trace import VersionInfo as VersionInfo
from ._record.trace import decode_trace as decode_trace
from ._record.trace import encode_trace as encode_trace

# Messages and the model boundary
from ._record.messages import AssistantMessage as AssistantMessage
from ._record.messages import ImagePart as ImagePart
from ._record.messages import Message as Message
from ._record.messages import Request as Request
from ._record.messages import Response as Response
from ._record.messages import SystemMessage as SystemMessage
from ._record.messages import TextPart as TextPart
from ._record.messages import Tool as Tool
from ._record.messages import ToolCall as ToolCall
from ._record.messages import ToolMessage as ToolMessage
from ._record.messages import Usage as Usage
from ._record.messages import UserMessage as UserMessage
from ._core.model import Model as Model
from ._core.session import RolloutSession as RolloutSession
from ._core.interception import ChatClient as ChatClient
from ._core.interception import Interception as Interception
from ._core.interception import LocalInterception as LocalInterception
from ._core.interception import Slot as Slot
from ._serving.proxy import HTTPInterception as HTTPInterception
from ._verifiers import verifiers_tasks as verifiers_tasks
from ._serving.upstream import OpenAIModel as OpenAIModel
from ._serving.weights import reload_weights as reload_weights

# Hooks and budgets
from ._core.hooks import intercept as intercept
from ._core.hooks import metric as metric
from ._core.hooks import reward as reward
from ._core.hooks import stop as stop
from ._core.limits import RolloutLimits as RolloutLimits
from ._core.limits import RolloutTimeouts as RolloutTimeouts
from ._core.limits import TaskResources as TaskResources

# Task, harness, runtime, rollout
from ._core.task import Judge as Judge
from ._core.task import PluggedReward as PluggedReward
from ._core.task import Task as Task
from ._core.task import TaskConfig as TaskConfig
from ._core.task import TaskData as TaskData
from ._core.peer_agent import PeerAgent as PeerAgent
from ._core.user_sim import ModelUser as ModelUser
from ._core.user_sim import ScriptedUser as ScriptedUser
from ._core.user_sim import UserSimulator as UserSimulator
from ._core.harness import Harness as Harness
from ._core.harness import HarnessContext as HarnessContext
from ._core.harness import HarnessSession as HarnessSession
from ._core.runtime import ProgramResult as ProgramResult
from ._core.runtime import Runtime as Runtime
from ._runtimes.local import LocalRuntime as LocalRuntime
from ._runtimes.sandbox import SandboxRuntime as SandboxRuntime
from ._core.rollout import Rollout as Rollout
from ._hosting.spec import RolloutSpec as RolloutSpec
from ._harnesses.chat import ChatHarness as ChatHarness
from ._harnesses.program import ProgramHarness as ProgramHarness
from ._harnesses.agents import AgentHarness as AgentHarness
from ._harnesses.agents import AgentsSdkHarness as AgentsSdkHarness
from ._harnesses.agents import ClaudeCodeHarness as ClaudeCodeHarness
from ._harnesses.agents import CodexHarness as CodexHarness
from ._harnesses.agents import MiniSweAgentHarness as MiniSweAgentHarness
from ._core.toolset import Toolset as Toolset
from ._core.toolset import tool as tool
from ._serving.tool_server import ToolServer as ToolServer
from ._serving.mcp_toolset import MCPToolset as MCPToolset
from ._serving.shared_server import SharedToolServer as SharedToolServer
from ._simulated.config import CapacityConfig as CapacityConfig
from ._simulated.config import SimulatedModelConfig as SimulatedModelConfig

# The driver, Arrow and the env-level finalize: loaded on first access (below).
from ._hosting.executor import Executor as Executor

# Errors
from ._errors import CorruptManifest as CorruptManifest
from ._errors import CorruptRun as CorruptRun
from ._errors import CorruptShard as CorruptShard
from ._errors import ForeignShard as ForeignShard
from ._errors import HarnessError as HarnessError
from ._errors import InfrastructureLost as InfrastructureLost
from ._errors import OverlongPromptError as OverlongPromptError
from ._errors import ProviderError as ProviderError
from ._errors import Refusal as Refusal
from ._errors import ResumeMismatch as ResumeMismatch
from ._errors import RolloutError as RolloutError
from ._errors import RunInUse as RunInUse
from ._errors import SandboxError as SandboxError
from ._errors import SchemaMismatch as SchemaMismatch
from ._errors import SessionConcluded as SessionConcluded
from ._errors import TaskError as TaskError
from ._errors import ToolInputError as ToolInputError
from ._errors import ToolsetError as ToolsetError
from ._errors import ToolServerError as ToolServerError
from ._errors import UserSimulatorError as UserSimulatorError
from ._errors import TurnRefused as TurnRefused
from ._errors import Unauthorized as Unauthorized
from ._errors import UpstreamError as UpstreamError
from ._errors import boundary as boundary

_logging.getLogger("rollout_ray").addHandler(_logging.NullHandler())

# Imported on first access: the Ray layer, so that the core never pays for (or needs) ray;
# the driver's side (Arrow, numpy, finalize), so that a process hosting rollouts (a Ray
# worker: one per actor) does not import it — 1-2 s of each actor's start.
_LAZY = {
    "Driver": "._driver.driver",
    "EvalConfig": "._driver.driver",
    "Group": "._driver.group",
    "Progress": "._driver.driver",
    "RunResult": "._driver.driver",
    "LocalExecutor": "._hosting.local_executor",
    "TRACE_SCHEMA": "._record.arrow",
    "RolloutRecord": "._record.arrow",
    "records_to_table": "._record.arrow",
    "table_to_traces": "._record.arrow",
    "ShardWriter": "._record.shard_writer",
    "read_run": "._record.store",
    "read_groups": "._record.store",
    "FinalizeConfig": "._driver.finalize",
    "Finalized": "._driver.finalize",
    "finalize": "._driver.finalize",
    "SimulatedModelServer": "._simulated.model_server",
    "RolloutActor": "._ray.rollout_client",
    "RuntimeActor": "._ray.runtime_actor",
    "RemoteRuntime": "._ray.remote_runtime",
    "RayExecutor": "._ray.ray_executor",
    "shutdown_node_services": "._ray.node_service_actor",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rollout_ray' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """What the package offers, the lazy names included (they are not in its namespace until
    first used): the public names and the module's own attributes."""
    return sorted(set(globals()) | set(_LAZY))


# The public names in two tiers (docs/public-names.md; tests/test_exports.py keeps the three in
# step). API: stable, documented, what a task, a harness, an evaluation or a trainer is written
# against; a change is a breaking change said in the notes. Advanced: the building blocks under
# it (interception, the Arrow record's writer, the Ray actors, executors of one's own), public
# so that they can be used and replaced, but they follow the internals and may change.
_API = (
    # the record
    "TRACE_VERSION",
    "AgentInfo",
    "AgentSpan",
    "Branch",
    "ErrorRecord",
    "InterceptRecord",
    "MessageNode",
    "ModelCall",
    "Reward",
    "RuntimeInfo",
    "TimeSpan",
    "TimeSplit",
    "Timing",
    "ToolCallRecord",
    "Trace",
    "TraceTask",
    "UserTurn",
    "VersionInfo",
    "agent_messages",
    "agent_rewards",
    "agent_sequences",
    "branch_agents",
    "decode_trace",
    "encode_trace",
    # messages and the model boundary
    "AssistantMessage",
    "ImagePart",
    "Message",
    "Request",
    "Response",
    "SystemMessage",
    "TextPart",
    "Tool",
    "ToolCall",
    "ToolMessage",
    "Usage",
    "UserMessage",
    "Model",
    "OpenAIModel",
    "SimulatedModelConfig",
    "SimulatedModelServer",
    "reload_weights",
    # hooks and budgets
    "intercept",
    "metric",
    "reward",
    "stop",
    "RolloutLimits",
    "RolloutTimeouts",
    "TaskResources",
    # task, harness, runtime
    "Judge",
    "Task",
    "TaskConfig",
    "TaskData",
    "Harness",
    "HarnessContext",
    "ProgramResult",
    "Runtime",
    "LocalRuntime",
    "SandboxRuntime",
    "ChatHarness",
    "ProgramHarness",
    "Toolset",
    "tool",
    "MCPToolset",
    "SharedToolServer",
    "AgentHarness",
    "AgentsSdkHarness",
    "CodexHarness",
    "ClaudeCodeHarness",
    "MiniSweAgentHarness",
    "UserSimulator",
    "ScriptedUser",
    "ModelUser",
    "PeerAgent",
    # the driver, the run's files and the env-level finalize
    "Driver",
    "verifiers_tasks",
    "EvalConfig",
    "Group",
    "RunResult",
    "LocalExecutor",
    "RayExecutor",
    "read_run",
    "read_groups",
    "FinalizeConfig",
    # errors
    "RolloutError",
    "TaskError",
    "HarnessError",
    "SandboxError",
    "ToolsetError",
    "ToolInputError",
    "ProviderError",
    "OverlongPromptError",
    "UpstreamError",
    "Refusal",
    "CorruptRun",
    "RunInUse",
    "ResumeMismatch",
    "UserSimulatorError",
)
_ADVANCED = (
    # the record: a former name
    "Error",
    # interception: how model calls reach the session
    "RolloutSession",
    "ChatClient",
    "Interception",
    "LocalInterception",
    "Slot",
    "HTTPInterception",
    # the simulated model's vLLM-like capacity model
    "CapacityConfig",
    # the lifecycle's parts, as executors use them
    "PluggedReward",
    "HarnessSession",
    "Rollout",
    "RolloutSpec",
    "ToolServer",
    "Executor",
    "Progress",
    # the Arrow record and finalize, piece by piece
    "TRACE_SCHEMA",
    "RolloutRecord",
    "records_to_table",
    "table_to_traces",
    "CorruptShard",
    "ShardWriter",
    "Finalized",
    "finalize",
    # the Ray layer (lazy)
    "RolloutActor",
    "RuntimeActor",
    "RemoteRuntime",
    "shutdown_node_services",
    # errors of the machinery
    "InfrastructureLost",
    "ToolServerError",
    "SessionConcluded",
    "TurnRefused",
    "Unauthorized",
    "boundary",
    "SchemaMismatch",
    "CorruptManifest",
    "ForeignShard",
)
__all__ = [*_API, *_ADVANCED]
