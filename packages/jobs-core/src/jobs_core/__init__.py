"""jobs-core: durable background jobs for Python.

Declare a job with :func:`job`, enqueue it through its handle, run it with a :class:`Worker` over
any driver (:func:`open_driver`). Steps replay from storage after a crash; sleeps and event waits
hold no process; compensation unwinds a run that fails for good.
"""

from jobs_core._current import current_driver, install_driver, use_driver
from jobs_core._durations import Duration
from jobs_core.clock import SYSTEM_CLOCK, Clock, SystemClock
from jobs_core.context import CancelSignal, JobContext
from jobs_core.driver import (
    CAPABILITIES,
    EventBus,
    Introspector,
    JobDriver,
    LeaseStore,
    StepStore,
    capability,
    open_driver,
    require_capability,
)
from jobs_core.errors import JobsError, classify
from jobs_core.events import events_purge_target, publish_event, reset_event_bus
from jobs_core.job import REGISTRY, JobHandle, JobRegistry, Settled, job
from jobs_core.limits import Concurrency, Limits
from jobs_core.metrics import JobsMetrics
from jobs_core.outbox import (
    MemoryOutboxStore,
    MemoryTransaction,
    Outbox,
    Relay,
    install_outbox,
    uninstall_outbox,
    use_outbox,
)
from jobs_core.retry import Retry, retry_schedule
from jobs_core.scheduler import Scheduler
from jobs_core.steps import Step, SyncStep
from jobs_core.task import TASK_REGISTRY, CatchUp, TaskHandle, TaskRegistry, next_task_run, task
from jobs_core.tenancy import Actor, acting_as, cross_tenant, current_actor
from jobs_core.types import (
    COUNTER_TIERS,
    DEFAULT_EVENT_POLL_MS,
    LIVE_STATES,
    MAX_COUNTER_ROWS,
    MAX_ENQUEUE_BATCH,
    MAX_JOB_PAGE,
    MAX_WORKER_IN_FLIGHT,
    ON_SETTLED_TIMEOUT_MS,
    PROGRESS_INTERVAL_MS,
    REQUEUEABLE_STATES,
    UNWIND_MARGIN,
    WAKING_EVENT_POLL_MS,
    CounterTierSpec,
    EnqueueResult,
    JobFilter,
    JobInfo,
    JobPage,
    JobState,
    QueueStats,
    nack_state,
)
from jobs_core.worker import Worker, WorkerStats

__version__ = "0.1.0"

__all__ = [
    "CAPABILITIES",
    "COUNTER_TIERS",
    "DEFAULT_EVENT_POLL_MS",
    "LIVE_STATES",
    "MAX_COUNTER_ROWS",
    "MAX_ENQUEUE_BATCH",
    "MAX_JOB_PAGE",
    "MAX_WORKER_IN_FLIGHT",
    "ON_SETTLED_TIMEOUT_MS",
    "PROGRESS_INTERVAL_MS",
    "REGISTRY",
    "REQUEUEABLE_STATES",
    "SYSTEM_CLOCK",
    "TASK_REGISTRY",
    "UNWIND_MARGIN",
    "WAKING_EVENT_POLL_MS",
    "Actor",
    "CancelSignal",
    "CatchUp",
    "Clock",
    "Concurrency",
    "CounterTierSpec",
    "Duration",
    "EnqueueResult",
    "EventBus",
    "Introspector",
    "JobContext",
    "JobDriver",
    "JobFilter",
    "JobHandle",
    "JobInfo",
    "JobPage",
    "JobRegistry",
    "JobState",
    "JobsError",
    "JobsMetrics",
    "LeaseStore",
    "Limits",
    "MemoryOutboxStore",
    "MemoryTransaction",
    "Outbox",
    "QueueStats",
    "Relay",
    "Retry",
    "Scheduler",
    "Settled",
    "Step",
    "StepStore",
    "SyncStep",
    "SystemClock",
    "TaskHandle",
    "TaskRegistry",
    "Worker",
    "WorkerStats",
    "acting_as",
    "capability",
    "classify",
    "cross_tenant",
    "current_actor",
    "current_driver",
    "events_purge_target",
    "install_driver",
    "install_outbox",
    "job",
    "nack_state",
    "next_task_run",
    "open_driver",
    "publish_event",
    "require_capability",
    "reset_event_bus",
    "retry_schedule",
    "task",
    "uninstall_outbox",
    "use_driver",
    "use_outbox",
]
