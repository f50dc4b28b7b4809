"""rollout_ray: RL rollouts with the verifiers v1 lifecycle, on Ray.

Importing this package never imports ``ray``: the lifecycle core is plain asyncio, and the
Ray-backed names (``RolloutActor``, ``RuntimeActor``, ...) load on first access.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

# The record
from ._trace import TRACE_VERSION as TRACE_VERSION
from ._trace import AgentInfo as AgentInfo
from ._trace import AgentSpan as AgentSpan
from ._trace import Branch as Branch
from ._trace import Error as Error
from ._trace import InterceptRecord as InterceptRecord
from ._trace import MessageNode as MessageNode
from ._trace import ModelCall as ModelCall
from ._trace import Reward as Reward
from ._trace import RuntimeInfo as RuntimeInfo
from ._trace import TimeSpan as TimeSpan
from ._trace import TimeSplit as TimeSplit
from ._trace import Timing as Timing
from ._trace import Trace as Trace
from ._trace import ToolCallRecord as ToolCallRecord
from ._trace import TraceTask as TraceTask
from ._trace import decode_trace as decode_trace
from ._trace import encode_trace as encode_trace

# Messages and the model boundary
from ._messages import AssistantMessage as AssistantMessage
from ._messages import ImagePart as ImagePart
from ._messages import Message as Message
from ._messages import Request as Request
from ._messages import Response as Response
from ._messages import SystemMessage as SystemMessage
from ._messages import TextPart as TextPart
from ._messages import Tool as Tool
from ._messages import ToolCall as ToolCall
from ._messages import ToolMessage as ToolMessage
from ._messages import Usage as Usage
from ._messages import UserMessage as UserMessage
from ._model import Model as Model
from ._session import RolloutSession as RolloutSession
from ._interception import ChatClient as ChatClient
from ._interception import Interception as Interception
from ._interception import LocalInterception as LocalInterception
from ._interception import Slot as Slot
from ._proxy import HTTPInterception as HTTPInterception
from ._upstream import OpenAIModel as OpenAIModel

# Hooks and budgets
from ._hooks import intercept as intercept
from ._hooks import metric as metric
from ._hooks import reward as reward
from ._hooks import stop as stop
from ._limits import RolloutLimits as RolloutLimits
from ._limits import RolloutTimeouts as RolloutTimeouts

# Task, harness, runtime, rollout
from ._task import Judge as Judge
from ._task import PluggedReward as PluggedReward
from ._task import Task as Task
from ._task import TaskConfig as TaskConfig
from ._task import TaskData as TaskData
from ._harness import Harness as Harness
from ._harness import HarnessContext as HarnessContext
from ._harness import HarnessSession as HarnessSession
from ._runtime import ProgramResult as ProgramResult
from ._runtime import Runtime as Runtime
from ._local_runtime import LocalRuntime as LocalRuntime
from ._sandbox_runtime import SandboxRuntime as SandboxRuntime
from ._rollout import Rollout as Rollout
from ._rollout_host import RolloutSpec as RolloutSpec
from ._chat_harness import ChatHarness as ChatHarness
from ._program_harness import ProgramHarness as ProgramHarness
from ._toolset import Toolset as Toolset
from ._toolset import ToolInputError as ToolInputError
from ._toolset import tool as tool
from ._tool_server import ToolServer as ToolServer
from ._simulated_model import SimulatedModelConfig as SimulatedModelConfig

# The driver, Arrow and the env-level finalize
from ._driver import Driver as Driver
from ._driver import EvalConfig as EvalConfig
from ._driver import Group as Group
from ._driver import Progress as Progress
from ._driver import RunResult as RunResult
from ._executor import Executor as Executor
from ._executor import InfrastructureLost as InfrastructureLost
from ._executor import LocalExecutor as LocalExecutor
from ._arrow import TRACE_SCHEMA as TRACE_SCHEMA
from ._arrow import RolloutRecord as RolloutRecord
from ._arrow import records_to_table as records_to_table
from ._arrow import table_to_traces as table_to_traces
from ._store import CorruptShard as CorruptShard
from ._store import ShardWriter as ShardWriter
from ._store import read_run as read_run
from ._finalize import FinalizeConfig as FinalizeConfig
from ._finalize import Finalized as Finalized
from ._finalize import finalize as finalize
from ._simulated_model import SimulatedModelServer as SimulatedModelServer

# Errors
from ._errors import HarnessError as HarnessError
from ._errors import OverlongPromptError as OverlongPromptError
from ._errors import ProviderError as ProviderError
from ._errors import Refusal as Refusal
from ._errors import RolloutError as RolloutError
from ._errors import SandboxError as SandboxError
from ._errors import SessionConcluded as SessionConcluded
from ._errors import TaskError as TaskError
from ._errors import ToolsetError as ToolsetError
from ._errors import TurnRefused as TurnRefused
from ._errors import Unauthorized as Unauthorized
from ._errors import UpstreamError as UpstreamError
from ._errors import boundary as boundary

logging.getLogger("rollout_ray").addHandler(logging.NullHandler())

# The Ray layer, imported on first access so that the core never pays for (or needs) ray.
_LAZY = {
    "RolloutActor": "._actors",
    "RuntimeActor": "._actors",
    "RemoteRuntime": "._remote_runtime",
    "RayExecutor": "._ray_executor",
    "shutdown_node_services": "._actors",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rollout_ray' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__all__ = [
    # the record
    "TRACE_VERSION", "AgentInfo", "AgentSpan", "Branch", "Error", "InterceptRecord",
    "MessageNode", "ModelCall", "Reward", "RuntimeInfo", "TimeSpan", "TimeSplit", "Timing",
    "ToolCallRecord", "Trace", "TraceTask", "decode_trace", "encode_trace",
    # messages and the model boundary
    "AssistantMessage", "ImagePart", "Message", "Request", "Response", "SystemMessage",
    "TextPart", "Tool", "ToolCall", "ToolMessage", "Usage", "UserMessage", "Model",
    "RolloutSession", "ChatClient", "Interception", "LocalInterception", "Slot",
    "HTTPInterception", "OpenAIModel", "SimulatedModelConfig", "SimulatedModelServer",
    # hooks and budgets
    "intercept", "metric", "reward", "stop", "RolloutLimits", "RolloutTimeouts",
    # task, harness, runtime, rollout
    "Judge", "PluggedReward", "Task", "TaskConfig", "TaskData", "Harness", "HarnessContext",
    "HarnessSession", "ProgramResult", "Runtime", "LocalRuntime", "SandboxRuntime", "Rollout",
    "RolloutSpec",
    "ChatHarness", "ProgramHarness", "Toolset", "ToolInputError", "tool", "ToolServer",
    # the driver, Arrow and the env-level finalize
    "Driver", "EvalConfig", "Group", "Progress", "RunResult", "Executor", "InfrastructureLost",
    "LocalExecutor", "TRACE_SCHEMA", "RolloutRecord", "records_to_table", "table_to_traces",
    "CorruptShard", "ShardWriter", "read_run", "FinalizeConfig", "Finalized", "finalize",
    # the Ray layer (lazy)
    "RolloutActor", "RuntimeActor", "RemoteRuntime", "RayExecutor", "shutdown_node_services",
    # errors
    "HarnessError", "OverlongPromptError", "ProviderError", "Refusal", "RolloutError",
    "SandboxError", "SessionConcluded", "TaskError", "ToolsetError", "TurnRefused",
    "Unauthorized", "UpstreamError", "boundary",
]  # fmt: skip
