"""The error registry: one class per ``X_…`` code, each with a one-line fix.

Every error the library raises is a :class:`JobsError` subclass carrying ``code`` (the stable
``X_…`` name operators search for), ``fix`` (one line telling the reader what to change) and
``meta`` (structured, JSON-able details; never a job's payload).

The table in the package README is generated from :data:`ERROR_CODES` by
``python -m jobs_core.errors`` and a test checks the two agree, so the documentation cannot drift
from the code.

Classification decides what the queue does with an error raised by a job body (``10-core.md``
§3): ``terminal`` dead-letters at once with attempts unspent, ``retry_after`` retries at the time
named by ``meta["retry_after_seconds"]``, anything else follows the backoff schedule.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

Classification = Literal["terminal", "retry_after", "retry"]


@dataclass(frozen=True, slots=True)
class ErrorCode:
    """One row of the registry.

    Attributes:
        code: the stable ``X_…`` name.
        class_name: the name of the :class:`JobsError` subclass raised for it.
        summary: what it means, one sentence.
        fix: what the reader should change, one line.
        classification: what the queue does when a job body raises it.
    """

    code: str
    class_name: str
    summary: str
    fix: str
    classification: Classification = "retry"


ERROR_CODES: tuple[ErrorCode, ...] = (
    ErrorCode(
        "X_JOB_DECLARATION_INVALID",
        "JobDeclarationInvalidError",
        "A job or task declaration has missing or bad fields (all of them are listed).",
        "Correct every field named in the message; declarations are checked at import time.",
        "terminal",
    ),
    ErrorCode(
        "X_IDEMPOTENCY_REQUIRED",
        "IdempotencyRequiredError",
        "A job was declared without an idempotency_key, or it answered an empty key.",
        "Pass idempotency_key=lambda input: '<stable key>' naming the work, never empty.",
        "terminal",
    ),
    ErrorCode(
        "X_JOB_TENANT_REQUIRED",
        "TenantRequiredError",
        "A job was declared without a tenant.",
        'Pass tenant=lambda input: <org id> or tenant="none" for work that belongs to no tenant.',
        "terminal",
    ),
    ErrorCode(
        "X_JOB_DUPLICATE",
        "JobDuplicateError",
        "Two declarations share one job name, or an enqueue under on_conflict='error' met a live job.",
        "Give each job its own name=; or enqueue with on_conflict='dedupe' to receive the live job's ids.",
        "terminal",
    ),
    ErrorCode(
        "X_JOB_INPUT_INVALID",
        "JobInputInvalidError",
        "A job's input does not validate against its declared input model.",
        "Send input the model accepts; a stored payload that no longer parses needs a migration or a requeue with new input.",
        "terminal",
    ),
    ErrorCode(
        "X_JOB_RUN_ID_TAKEN",
        "JobRunIdTakenError",
        "An enqueue named a run id that another job holds or held; its steps would answer that job's outputs.",
        "Omit run_id= so a fresh one is minted; a run id belongs to one job (re-publish that job by its own id instead).",
        "terminal",
    ),
    ErrorCode(
        "X_JOB_OPTIONS_INVALID",
        "JobOptionsInvalidError",
        "An enqueue option (delay, run_at, queue, tenant_id, run_id, ...) is malformed.",
        "Correct the option named in the message; durations are '250ms', '30s', '10m', '3d', a timedelta or int ms.",
        "terminal",
    ),
    ErrorCode(
        "X_JOB_ENQUEUE_BATCH_TOO_LARGE",
        "EnqueueBatchTooLargeError",
        "enqueue_many was given more inputs than MAX_ENQUEUE_BATCH (10,000).",
        "Split the inputs into batches of at most 10,000.",
        "terminal",
    ),
    ErrorCode(
        "X_JOB_TENANT_MISMATCH",
        "TenantMismatchError",
        "The tenant stated at enqueue (explicit, enqueue_as or the ambient actor) is not the tenant the input names.",
        "Enqueue under the org the input belongs to, or wrap a deliberate ambient crossing in cross_tenant('why').",
        "terminal",
    ),
    ErrorCode(
        "X_DRIVER_UNAVAILABLE",
        "DriverUnavailableError",
        "No driver is installed, or the backend cannot be reached; nothing was queued.",
        "Install a driver (use_driver/install_driver or a worker) or bring the backend back; the call is safe to repeat.",
    ),
    ErrorCode(
        "X_DRIVER_UNKNOWN",
        "DriverUnknownError",
        "No installed package provides a driver for the URL's scheme.",
        "Install the scheme's driver: pip install 'jobs-core[pg]' for postgresql:// or postgres://, 'jobs-core[redis]' for redis:// or rediss://; memory:// is built in (from a source checkout: pip install -e packages/jobs-pg or -e packages/jobs-redis).",
        "terminal",
    ),
    ErrorCode(
        "X_SCHEMA_NOT_MIGRATED",
        "SchemaNotMigratedError",
        "The backend's schema lacks the driver's tables, or an older version of them: its migrations were not applied.",
        "Apply them, then start again: jobsctl pg migrate --driver URL (the same URL, its ?schema= included).",
        "terminal",
    ),
    ErrorCode(
        "X_DATABASE_NOT_FOUND",
        "DatabaseNotFoundError",
        "The database the URL names does not exist on that server.",
        "Create it (createdb NAME, or CREATE DATABASE NAME) or correct the database name at the end of the URL.",
        "terminal",
    ),
    ErrorCode(
        "X_AUTH_FAILED",
        "AuthenticationFailedError",
        "The server refused the URL's credentials: a wrong password, an unknown user, or no pg_hba.conf entry admits it.",
        "Correct the user and password in the URL (postgresql://USER:PASSWORD@host/db, with @ : / in a password percent-encoded) or set PGPASSWORD or ~/.pgpass.",
        "terminal",
    ),
    ErrorCode(
        "X_PERMISSION_DENIED",
        "PermissionDeniedError",
        "The URL's role lacks a privilege the driver needs (to connect to the database, or on the schema or its tables).",
        "Connect as the role that ran the migrations, or grant this one what the message names: GRANT USAGE ON SCHEMA s TO r; GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA s TO r.",
        "terminal",
    ),
    ErrorCode(
        "X_DRIVER_REQUEST_INVALID",
        "DriverRequestInvalidError",
        "A driver call was made with arguments the protocol refuses (e.g. claim with no queues).",
        "Correct the argument the message names; the JobDriver docstrings give each call's contract.",
        "terminal",
    ),
    ErrorCode(
        "X_NOT_IMPLEMENTED",
        "NotImplementedByDriverError",
        "The driver does not declare the capability this call needs.",
        "Use a driver that declares it: driver.describe() lists what each carries (postgresql:// carries every capability).",
        "terminal",
    ),
    ErrorCode(
        "X_STEP_DUPLICATE",
        "StepDuplicateError",
        "Two steps in one run share a name (step names are the replay key).",
        "Give each step a unique, deterministic name, e.g. f'send:{user_id}'.",
        "terminal",
    ),
    ErrorCode(
        "X_STEP_NAME_INVALID",
        "StepNameInvalidError",
        "A step name is empty, too long, or reserved ('unwinding', 'compensate:*').",
        "Use a non-empty name of at most 200 characters that is not reserved.",
        "terminal",
    ),
    ErrorCode(
        "X_STEP_OUTPUT_UNSERIALIZABLE",
        "StepOutputUnserializableError",
        "A step returned a value JSON cannot hold (bytes, set, a cycle, an arbitrary object, NUL in a string).",
        "Return JSON-able data: ids rather than object graphs, lists rather than sets, base64 text rather than bytes.",
        "terminal",
    ),
    ErrorCode(
        "X_STEP_OUTCOME_UNKNOWN",
        "StepOutcomeUnknownError",
        "A once=True step started and its completion was never recorded; running it again could repeat its effect.",
        "Check the effect, then: jobsctl resolve-step ID STEP --ran --output JSON (or --not-ran), then jobsctl retry ID.",
        "terminal",
    ),
    ErrorCode(
        "X_STEP_TIMEOUT",
        "StepTimeoutError",
        "A step.run outlived the job's step_timeout; its cancel signal was fired.",
        "Make the step faster, honour its cancel signal, or raise step_timeout.",
    ),
    ErrorCode(
        "X_STEP_NOT_RESOLVABLE",
        "StepNotResolvableError",
        "resolve_step was asked about a step that is not a once=True step left started without completion.",
        "Resolve only steps that failed with X_STEP_OUTCOME_UNKNOWN (jobsctl show ID lists them).",
        "terminal",
    ),
    ErrorCode(
        "X_ABORTED",
        "AbortedError",
        "A step write came after the attempt was cancelled or its claim was lost; it was refused.",
        "Nothing to fix in the run that replaced it; make bodies honour ctx.cancel so they stop sooner.",
    ),
    ErrorCode(
        "X_DRAINING",
        "DrainingError",
        "The worker is shutting down (SIGTERM/SIGINT); the attempt is interrupted and not counted.",
        "Nothing: the job is handed back and runs again on another worker.",
    ),
    ErrorCode(
        "X_JOB_TIMEOUT",
        "JobTimeoutError",
        "An attempt outlived the job's timeout, or a required wait_for_event timed out.",
        "Raise timeout=, make the body honour ctx.cancel, or handle the missing event.",
    ),
    ErrorCode(
        "X_JOB_CHILD_FAILED",
        "ChildJobFailedError",
        "A child job of step.invoke/step.gather ended without a result (dead, failed, cancelled "
        "or removed); the error carries the child's own code when it has one.",
        "Read the child's last error (jobsctl show CHILD_ID), fix it, then requeue the child and "
        "the parent.",
        "terminal",
    ),
    ErrorCode(
        "X_JOB_CANCELLED",
        "JobCancelledError",
        "An operator cancelled the job while it was live.",
        "Nothing: requeue it (jobsctl retry ID) if the cancel was a mistake.",
        "terminal",
    ),
    ErrorCode(
        "X_JOB_LEASE_LOST",
        "LeaseLostError",
        "The worker lost the job's lease (no renewal landed for a whole visibility timeout).",
        "Keep bodies from blocking the event loop (CPU work belongs in a sync body) or raise the visibility timeout.",
    ),
    ErrorCode(
        "X_JOB_SLOT_LOST",
        "SlotLostError",
        "The attempt lost its fleet concurrency slot (its renewal was refused); it is handed back, not counted.",
        "Keep bodies from blocking the event loop, or raise the visibility timeout (the slot lives as long as the lease).",
    ),
    ErrorCode(
        "X_JOB_MAX_ATTEMPTS",
        "MaxAttemptsError",
        "The row's attempts ran out; the error text names the last attempt's own code and message.",
        "Fix what the last attempt failed with (see the error text), then jobsctl retry ID.",
        "terminal",
    ),
    ErrorCode(
        "X_JOB_EVENT_INVALID",
        "EventInvalidError",
        "A stored event does not validate against the wait's schema (the issues are listed; the payload is not).",
        "Publish payloads the waiting schema accepts, or widen the schema.",
        "terminal",
    ),
    ErrorCode(
        "X_JOB_COMPENSATION_FAILED",
        "CompensationFailedError",
        "A compensator kept failing after the unwind used its attempts; the run is dead.",
        "Fix the compensator, then jobsctl retry ID: finished compensators are not run again.",
        "terminal",
    ),
    ErrorCode(
        "X_JOB_KEY_BUSY",
        "KeyBusyError",
        "A job with Concurrency(when_busy='fail') found every slot of its key taken; the body never ran.",
        "Use when_busy='wait', raise the limit, or enqueue later.",
        "terminal",
    ),
    ErrorCode(
        "X_JOB_CONCURRENCY_UNENFORCEABLE",
        "ConcurrencyUnenforceableError",
        "A job declares fleet concurrency but the worker's driver has no lease store.",
        "Run the worker on a driver with leases (memory://, postgresql://) or drop concurrency= from the job.",
        "terminal",
    ),
    ErrorCode(
        "X_JOB_RATE_LIMITED",
        "RateLimitedError",
        "A job with Rate(when_limited='fail') found its bucket's tokens spent; the body never ran and the attempt counts.",
        "Use when_limited='wait' to hand the row back until the next token is free, or raise the rate.",
    ),
    ErrorCode(
        "X_JOB_RATE_UNENFORCEABLE",
        "RateUnenforceableError",
        "A job declares a fleet rate but the worker's driver has no rate store.",
        "Run the worker on a driver with the rate capability (memory://, postgresql://, redis://) or drop rate= from the job.",
        "terminal",
    ),
    ErrorCode(
        "X_JOB_UNKNOWN",
        "JobUnknownError",
        "A job name no imported module declares: a row a worker claimed, or the NAME given to jobsctl enqueue.",
        "Import the module that declares the job (jobsctl worker APP ..., jobsctl enqueue NAME --app APP); a row of a job no module declares any more can be removed (jobsctl rm ID).",
    ),
    ErrorCode(
        "X_JOB_ON_SETTLED_FAILED",
        "OnSettledFailedError",
        "A job's on_settled hook kept failing inside on_settled_timeout; the row is unchanged.",
        "Make the hook idempotent and quick; it is told at most once per ending.",
        "terminal",
    ),
    ErrorCode(
        "X_JOB_NOT_FOUND",
        "JobNotFoundError",
        "No job has that id.",
        "Check the id (jobsctl ls lists them).",
        "terminal",
    ),
    ErrorCode(
        "X_JOB_PAGE_INVALID",
        "JobPageInvalidError",
        "A list limit above MAX_JOB_PAGE (200) or a cursor this listing did not issue.",
        "Use limit<=200 and pass back the cursor a previous page answered.",
        "terminal",
    ),
    ErrorCode(
        "X_JOB_NOT_CANCELLABLE",
        "JobNotCancellableError",
        "Only live jobs (ready, delayed, running, suspended) can be cancelled.",
        "Nothing to cancel: the job already finished.",
        "terminal",
    ),
    ErrorCode(
        "X_JOB_NOT_REQUEUEABLE",
        "JobNotRequeueableError",
        "Only finished jobs (dead, cancelled, done, failed) can be requeued.",
        "Wait for the job to finish, or cancel it first.",
        "terminal",
    ),
    ErrorCode(
        "X_JOB_NOT_REMOVABLE",
        "JobNotRemovableError",
        "A running job cannot be removed.",
        "Cancel it first, then remove it.",
        "terminal",
    ),
    ErrorCode(
        "X_JOB_NOT_PROMOTABLE",
        "JobNotPromotableError",
        "Only a job waiting on run_at (delayed or suspended) can be promoted.",
        "Nothing to promote: the job is already due or finished.",
        "terminal",
    ),
    ErrorCode(
        "X_JOB_CRASH_DIVERGED",
        "CrashDivergedError",
        "A run killed at a step boundary produced an effect more often than a clean run: an effect lives outside a step.",
        "Move the effect into step.run so a replay answers it from storage.",
        "terminal",
    ),
    ErrorCode(
        "X_TENANCY_CROSS_FORBIDDEN",
        "CrossTenantForbiddenError",
        "cross_tenant() was entered by no actor, or by one not permitted to cross tenants.",
        "Act as an actor holding the 'tenancy:cross' permission (Actor(..., permissions={'tenancy:cross'})).",
        "terminal",
    ),
    ErrorCode(
        "X_OUTBOX_NO_TX",
        "OutboxNoTransactionError",
        "The outbox is installed with mode='required' and the enqueue ran outside a transaction.",
        "Enqueue inside the outbox store's transaction (jobs_pg.transaction(conn), MemoryOutboxStore.transaction()), pass outbox=tx, or install with mode='optional'.",
        "terminal",
    ),
    ErrorCode(
        "X_SYNC_IN_LOOP",
        "SyncCallInLoopError",
        "A *_sync function was called on a thread running an event loop, which it would block.",
        "Await the async twin the message names (enqueue for enqueue_sync), or call from a thread without a running loop.",
        "terminal",
    ),
    # jobs-webhooks (packages/jobs-webhooks): outbound delivery, then the inbound receiver.
    ErrorCode(
        "X_WEBHOOK_DELIVERY_FAILED",
        "WebhookDeliveryFailedError",
        "A webhook attempt failed (a non-2xx answer, a 3xx, a timeout, a refused connection); it is retried on the job's backoff.",
        "Nothing while retries remain; check the endpoint (the ledger's attempts show each status and excerpt).",
        "retry_after",
    ),
    ErrorCode(
        "X_WEBHOOK_DELIVERY_REJECTED",
        "WebhookDeliveryRejectedError",
        "The endpoint refused the delivery for good (410 Gone or another status declared permanent).",
        "Nothing to retry: remove or disable the subscription, or fix it and enqueue the delivery again.",
        "terminal",
    ),
    ErrorCode(
        "X_WEBHOOK_DELIVERY_THROTTLED",
        "WebhookDeliveryThrottledError",
        "The endpoint answered 429 or 503 with Retry-After; the retry waits that long (clamped by max_delay, jittered).",
        "Nothing: the delivery retries when the endpoint asked; raise retry.max_delay to honour longer waits.",
        "retry_after",
    ),
    ErrorCode(
        "X_WEBHOOK_ENDPOINT_INVALID",
        "WebhookEndpointInvalidError",
        "The endpoint cannot be delivered to: a bad URL or secret, none found, or an address the SSRF guard refuses.",
        "Give the endpoint an http(s) URL that resolves to a public address and whsec_ secrets; Endpoint(allow_private=True) for a trusted internal one.",
        "terminal",
    ),
    ErrorCode(
        "X_WEBHOOK_ENDPOINT_DISABLED",
        "WebhookEndpointDisabledError",
        "The ledger holds the endpoint disabled (disable_after consecutive failures, or the app); nothing was sent.",
        "Fix the endpoint, then re-enable it with await ledger.enable(endpoint_id) and enqueue the delivery again.",
        "terminal",
    ),
    ErrorCode(
        "X_WEBHOOK_EVENT_MISSING",
        "WebhookEventMissingError",
        "The delivery's event(input) lookup found no event; nothing was sent.",
        "Keep events until their deliveries settle, or stop enqueueing deliveries of deleted events.",
        "terminal",
    ),
    ErrorCode(
        "X_WEBHOOK_SIGNATURE_INVALID",
        "WebhookSignatureInvalidError",
        "An inbound webhook's signature did not verify (missing, forged, or a timestamp outside the tolerance).",
        "Check the shared secret and the sender's clock; the receiver answers 401 with no detail.",
        "terminal",
    ),
    ErrorCode(
        "X_WEBHOOK_EVENT_ID_INVALID",
        "WebhookEventIdInvalidError",
        "verify answered an event id that is not 1-256 printable ASCII characters (answered 422; never echoed).",
        "Take the event id from the verified bytes (a signed header or the signed body), 1-256 printable ASCII characters.",
        "terminal",
    ),
    ErrorCode(
        "X_WEBHOOK_RECEIVER_UNAVAILABLE",
        "WebhookReceiverUnavailableError",
        "The receiver could not write the event's job (the driver failed); it answered 503 with Retry-After.",
        "Bring the driver's backend back: the sender redelivers, and nothing was acknowledged.",
    ),
    ErrorCode(
        "X_WEBHOOK_RECEIVER_INVALID",
        "WebhookReceiverInvalidError",
        "A webhook_receiver declaration has missing or bad fields (all of them are listed).",
        "Correct every field named: an absolute path, verify and handle functions, max_bytes an int >= 1.",
        "terminal",
    ),
    # jobs-import-export (packages/jobs-import-export): exports, imports, their storage.
    ErrorCode(
        "X_EXPORT_PART_TOO_LARGE",
        "ExportPartTooLargeError",
        "One page of an export encoded to more than max_part_bytes; no part was written for it.",
        "Lower export_rows(batch=...) (the message names the page, its size and the batch) or raise max_part_bytes.",
        "terminal",
    ),
    ErrorCode(
        "X_EXPORT_ROW_INVALID",
        "ExportRowInvalidError",
        "row() answered a key that is not in columns, or a value the format cannot hold (the column is named, never the value).",
        "Make row() answer only the declared columns, with text, numbers, booleans, None, dates, times or UUIDs.",
        "terminal",
    ),
    ErrorCode(
        "X_IMPORT_RECORD_TOO_LARGE",
        "ImportRecordTooLargeError",
        "A record of the imported file is longer than max_record_bytes (its line is named).",
        "Fix the file at that line (an unclosed quote joins every later line into one record) or raise max_record_bytes, keeping page_bytes above it.",
        "terminal",
    ),
    ErrorCode(
        "X_IMPORT_HEADER_MISMATCH",
        "ImportHeaderMismatchError",
        "A CSV file's header does not name exactly the declared columns (the missing and undeclared ones are listed), or the file names no columns at all.",
        "Make the file's first line name exactly the declared columns, in any order, then import it again.",
        "terminal",
    ),
    ErrorCode(
        "X_IMPORT_TOO_MANY_ERRORS",
        "ImportTooManyErrorsError",
        "An import refused more rows than max_row_errors allows; the run stopped and its refusals were written.",
        "Read the errors-NNNNN.ndjson files under the run's error prefix, fix the file and import it again (or raise max_row_errors).",
        "terminal",
    ),
    ErrorCode(
        "X_IMPORT_SOURCE_CHANGED",
        "ImportSourceChangedError",
        "The object being imported answered fewer bytes than the size recorded when its run began.",
        "Never overwrite an object while it is imported: upload the new file under a new key and import that.",
        "terminal",
    ),
    ErrorCode(
        "X_STORAGE_KEY_INVALID",
        "StorageKeyInvalidError",
        "An object key is empty, starts with '/', has an empty, '.' or '..' segment, a control character, or more than 1,024 bytes.",
        "Build keys from non-empty segments joined by '/', e.g. f'exports/{org_id}/{export_id}'.",
        "terminal",
    ),
    ErrorCode(
        "X_STORAGE_NOT_FOUND",
        "StorageNotFoundError",
        "The object to import does not exist in the source.",
        "Upload the object before enqueueing its import, or correct key(input); then jobsctl retry ID.",
        "terminal",
    ),
    # Factories over job() (jobs_core.factories, jobs_pg.factories).
    ErrorCode(
        "X_BACKFILL_SOURCE_INVALID",
        "BackfillSourceInvalidError",
        "A backfill declares no source, or both source= and pages=, or a page that is not (rows, next).",
        "Pass exactly one of source=lambda ctx: keyset(...) or pages=(cursor, cancel, input) -> (rows, next).",
        "terminal",
    ),
    ErrorCode(
        "X_BACKFILL_STALLED",
        "BackfillStalledError",
        "A backfill's count() still answered rows to do after its last page: the pass did not reach them.",
        "Make handle() change every row it is given so the source stops matching it, then enqueue the backfill again.",
        "terminal",
    ),
    ErrorCode(
        "X_BACKFILL_ENVIRONMENT",
        "BackfillEnvironmentError",
        "A backfill declared environments= and this process's JOBS_ENV is not one of them.",
        "Run it where JOBS_ENV names a declared environment, or add this one to environments=.",
        "terminal",
    ),
    ErrorCode(
        "X_BACKFILL_MIGRATION_PENDING",
        "BackfillMigrationPendingError",
        "A backfill requires= a schema migration that migrations() does not list as applied.",
        "Apply the migration first (the deploy's migrate step), then enqueue the backfill.",
        "terminal",
    ),
    ErrorCode(
        "X_CONSUMER_INVALID",
        "ConsumerInvalidError",
        "A consumer declaration has missing or bad fields: no cursor store, a timeout, a bad batch or rearm.",
        "Pass cursor= (a ConsumerCursor), no timeout=, batch an int 1..10,000 and rearm a duration such as '1m' that divides an hour or a day.",
        "terminal",
    ),
    ErrorCode(
        "X_CONSUMER_SELF_ENQUEUE",
        "ConsumerSelfEnqueueError",
        "A consumer's run enqueued its own consumer: the enqueue would dedupe onto the running row and arm nothing.",
        "Return the next cursor from handle() and let the supervisor re-arm the keys; never enqueue the consumer from inside it.",
        "terminal",
    ),
    ErrorCode(
        "X_JOB_ROLLUP_INVALID",
        "RollupInvalidError",
        "A rollup declaration is wrong: a bad field, or its into= table lacks a unique index on exactly its key columns.",
        "Correct the field named, or CREATE UNIQUE INDEX ON <into> (<key columns>) (no WHERE, no expressions).",
        "terminal",
    ),
    ErrorCode(
        "X_JOB_REFRESH_VIEW_INVALID",
        "RefreshViewInvalidError",
        "A refresh_view names no materialized view, or asks for concurrently=True on one with no plain unique index.",
        "Create the materialized view (and for concurrently=True a unique index on its columns, no WHERE, no expressions).",
        "terminal",
    ),
    # jobs-subject (packages/jobs-subject): one person's data exported or erased.
    ErrorCode(
        "X_SUBJECT_DECLARATION_INVALID",
        "SubjectDeclarationInvalidError",
        "A define_subject declaration has missing or bad fields, or its table, key or columns are not in the database (all problems are listed).",
        "Correct every field named: the subject's table and a unique key of it, columns= naming real columns, batch an int >= 1.",
        "terminal",
    ),
    ErrorCode(
        "X_SUBJECT_TABLE_UNDECLARED",
        "SubjectTableUndeclaredError",
        "A table references the subject (through the key path named) and has no declared treatment; no row was touched.",
        "Add the table to define_subject(tables={...}) as Treatment.DELETE, Treatment.RETAIN('why') or Treatment.ANONYMIZE({...}).",
        "terminal",
    ),
    ErrorCode(
        "X_SUBJECT_TREATMENT_INVALID",
        "SubjectTreatmentInvalidError",
        "A declared treatment cannot apply (a NOT NULL column anonymised to NULL, a kept row under a RESTRICT or CASCADE key, a table that is not reached); no row was touched.",
        "Change the treatment named: clear the key in ANONYMIZE, make the column nullable, change the key's ON DELETE, or drop the stale entry.",
        "terminal",
    ),
    ErrorCode(
        "X_SUBJECT_CYCLE",
        "SubjectCycleError",
        "Tables the erase deletes reference each other in a loop whose closing key cannot be cleared (its columns are NOT NULL); no row was touched.",
        "Make one key of the loop nullable (the message names it) so the erase can clear it first, or treat a table of the loop other than DELETE.",
        "terminal",
    ),
    ErrorCode(
        "X_SUBJECT_ERASE_BLOCKED",
        "SubjectEraseBlockedError",
        "New rows kept referencing the subject's rows while they were erased, so a delete was refused by a foreign key three rounds running.",
        "Stop the subject's writes first (disable the account); the job retries on its backoff and resumes where it stopped.",
    ),
)

_BY_CODE: dict[str, ErrorCode] = {entry.code: entry for entry in ERROR_CODES}
_CLASSIFIED: dict[str, Classification] = {entry.code: entry.classification for entry in ERROR_CODES}


class JobsError(Exception):
    """Base of every error this library raises.

    Attributes:
        code: the stable ``X_…`` name (class attribute, one per subclass).
        fix: one line telling the reader what to change.
        meta: structured details (JSON-able); never a job's payload.

    Args:
        message: what went wrong, in words; defaults to the registry's summary.
        meta: structured details to attach.
    """

    code: ClassVar[str] = "X_JOBS"
    fix: ClassVar[str] = ""

    def __init__(self, message: str | None = None, **meta: Any) -> None:
        summary = _BY_CODE[self.code].summary if self.code in _BY_CODE else self.code
        self.message = message or summary
        self.meta: dict[str, Any] = dict(meta)
        super().__init__(f"{self.code}: {self.message}")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        entry = _BY_CODE.get(cls.code)
        if entry is not None:
            cls.fix = entry.fix


class JobDeclarationInvalidError(JobsError):
    """A job or task declaration has missing or bad fields (all of them are listed)."""

    code = "X_JOB_DECLARATION_INVALID"


class IdempotencyRequiredError(JobsError):
    """A job was declared without an idempotency_key, or it answered an empty key."""

    code = "X_IDEMPOTENCY_REQUIRED"


class TenantRequiredError(JobsError):
    """A job was declared without a tenant."""

    code = "X_JOB_TENANT_REQUIRED"


class JobDuplicateError(JobsError):
    """Two declarations share one job name, or an enqueue under on_conflict='error' met a live job."""

    code = "X_JOB_DUPLICATE"


class JobInputInvalidError(JobsError):
    """A job's input does not validate against its declared input model."""

    code = "X_JOB_INPUT_INVALID"


class JobRunIdTakenError(JobsError):
    """An enqueue named a run id that another job holds or held; its steps would answer that job's outputs."""

    code = "X_JOB_RUN_ID_TAKEN"


class JobOptionsInvalidError(JobsError):
    """An enqueue option (delay, run_at, queue, tenant_id, run_id, ...) is malformed."""

    code = "X_JOB_OPTIONS_INVALID"


class EnqueueBatchTooLargeError(JobsError):
    """enqueue_many was given more inputs than MAX_ENQUEUE_BATCH (10,000)."""

    code = "X_JOB_ENQUEUE_BATCH_TOO_LARGE"


class TenantMismatchError(JobsError):
    """The tenant stated at enqueue (explicit, enqueue_as or the ambient actor) is not the tenant the input names."""

    code = "X_JOB_TENANT_MISMATCH"


class DriverUnavailableError(JobsError):
    """No driver is installed, or the backend cannot be reached; nothing was queued."""

    code = "X_DRIVER_UNAVAILABLE"


class DriverUnknownError(JobsError):
    """No installed package provides a driver for the URL's scheme."""

    code = "X_DRIVER_UNKNOWN"


class SchemaNotMigratedError(JobsError):
    """The backend's schema lacks the driver's tables, or an older version of them: its migrations were not applied."""

    code = "X_SCHEMA_NOT_MIGRATED"


class DatabaseNotFoundError(JobsError):
    """The database the URL names does not exist on that server."""

    code = "X_DATABASE_NOT_FOUND"


class AuthenticationFailedError(JobsError):
    """The server refused the URL's credentials: a wrong password, an unknown user, or no pg_hba.conf entry admits it."""

    code = "X_AUTH_FAILED"


class PermissionDeniedError(JobsError):
    """The URL's role lacks a privilege the driver needs (to connect to the database, or on the schema or its tables)."""

    code = "X_PERMISSION_DENIED"


class DriverRequestInvalidError(JobsError):
    """A driver call was made with arguments the protocol refuses (e.g. claim with no queues)."""

    code = "X_DRIVER_REQUEST_INVALID"


class NotImplementedByDriverError(JobsError):
    """The driver does not declare the capability this call needs."""

    code = "X_NOT_IMPLEMENTED"


class StepDuplicateError(JobsError):
    """Two steps in one run share a name (step names are the replay key)."""

    code = "X_STEP_DUPLICATE"


class StepNameInvalidError(JobsError):
    """A step name is empty, too long, or reserved ('unwinding', 'compensate:*')."""

    code = "X_STEP_NAME_INVALID"


class StepOutputUnserializableError(JobsError):
    """A step returned a value JSON cannot hold (bytes, set, a cycle, an arbitrary object, NUL in a string)."""

    code = "X_STEP_OUTPUT_UNSERIALIZABLE"


class StepOutcomeUnknownError(JobsError):
    """A once=True step started and its completion was never recorded; running it again could repeat its effect."""

    code = "X_STEP_OUTCOME_UNKNOWN"


class StepTimeoutError(JobsError):
    """A step.run outlived the job's step_timeout; its cancel signal was fired."""

    code = "X_STEP_TIMEOUT"


class StepNotResolvableError(JobsError):
    """resolve_step was asked about a step that is not a once=True step left started without completion."""

    code = "X_STEP_NOT_RESOLVABLE"


class AbortedError(JobsError):
    """A step write came after the attempt was cancelled or its claim was lost; it was refused."""

    code = "X_ABORTED"


class DrainingError(JobsError):
    """The worker is shutting down (SIGTERM/SIGINT); the attempt is interrupted and not counted."""

    code = "X_DRAINING"


class JobTimeoutError(JobsError):
    """An attempt outlived the job's timeout, or a required wait_for_event timed out."""

    code = "X_JOB_TIMEOUT"


class JobCancelledError(JobsError):
    """An operator cancelled the job while it was live."""

    code = "X_JOB_CANCELLED"


class ChildJobFailedError(JobsError):
    """A child job of ``step.invoke``/``step.gather`` ended without a result.

    ``code`` is the child's own error code when it has one (``X_JOB_MAX_ATTEMPTS``, the app's
    code, ``X_JOB_CANCELLED`` for a cancelled child...), else ``X_JOB_CHILD_FAILED``; ``meta``
    names the step, the child's job id, state and code. Terminal: a replay meets the same child.
    """

    code = "X_JOB_CHILD_FAILED"

    def __init__(self, message: str, *, child_code: str | None = None, **meta: Any) -> None:
        """Fail with ``message``, carrying ``child_code`` as this error's code when set."""
        if child_code:
            # An instance attribute shadows the class's code: the parent row then records the
            # child's code as its own last error code.
            self.__dict__["code"] = child_code
        super().__init__(message, child_code=child_code, terminal=True, **meta)


class LeaseLostError(JobsError):
    """The worker lost the job's lease (no renewal landed for a whole visibility timeout)."""

    code = "X_JOB_LEASE_LOST"


class SlotLostError(JobsError):
    """The attempt lost its fleet concurrency slot (its renewal was refused); it is handed back, not counted."""

    code = "X_JOB_SLOT_LOST"


class MaxAttemptsError(JobsError):
    """The row's attempts ran out; the error text names the last attempt's own code and message."""

    code = "X_JOB_MAX_ATTEMPTS"


class EventInvalidError(JobsError):
    """A stored event does not validate against the wait's schema (the issues are listed; the payload is not)."""

    code = "X_JOB_EVENT_INVALID"


class CompensationFailedError(JobsError):
    """A compensator kept failing after the unwind used its attempts; the run is dead."""

    code = "X_JOB_COMPENSATION_FAILED"


class KeyBusyError(JobsError):
    """A job with Concurrency(when_busy='fail') found every slot of its key taken; the body never ran."""

    code = "X_JOB_KEY_BUSY"


class ConcurrencyUnenforceableError(JobsError):
    """A job declares fleet concurrency but the worker's driver has no lease store."""

    code = "X_JOB_CONCURRENCY_UNENFORCEABLE"


class RateLimitedError(JobsError):
    """A job with Rate(when_limited='fail') found its bucket's tokens spent; the body never ran and the attempt counts."""

    code = "X_JOB_RATE_LIMITED"


class RateUnenforceableError(JobsError):
    """A job declares a fleet rate but the worker's driver has no rate store."""

    code = "X_JOB_RATE_UNENFORCEABLE"


class JobUnknownError(JobsError):
    """A job name no imported module declares: a row a worker claimed, or the NAME given to jobsctl enqueue."""

    code = "X_JOB_UNKNOWN"


class OnSettledFailedError(JobsError):
    """A job's on_settled hook kept failing inside on_settled_timeout; the row is unchanged."""

    code = "X_JOB_ON_SETTLED_FAILED"


class JobNotFoundError(JobsError):
    """No job has that id."""

    code = "X_JOB_NOT_FOUND"


class JobPageInvalidError(JobsError):
    """A list limit above MAX_JOB_PAGE (200) or a cursor this listing did not issue."""

    code = "X_JOB_PAGE_INVALID"


class JobNotCancellableError(JobsError):
    """Only live jobs (ready, delayed, running, suspended) can be cancelled."""

    code = "X_JOB_NOT_CANCELLABLE"


class JobNotRequeueableError(JobsError):
    """Only finished jobs (dead, cancelled, done, failed) can be requeued."""

    code = "X_JOB_NOT_REQUEUEABLE"


class JobNotRemovableError(JobsError):
    """A running job cannot be removed."""

    code = "X_JOB_NOT_REMOVABLE"


class JobNotPromotableError(JobsError):
    """Only a job waiting on run_at (delayed or suspended) can be promoted."""

    code = "X_JOB_NOT_PROMOTABLE"


class CrashDivergedError(JobsError):
    """A run killed at a step boundary produced an effect more often than a clean run: an effect lives outside a step."""

    code = "X_JOB_CRASH_DIVERGED"


class CrossTenantForbiddenError(JobsError):
    """cross_tenant() was entered by no actor, or by one not permitted to cross tenants."""

    code = "X_TENANCY_CROSS_FORBIDDEN"


class OutboxNoTransactionError(JobsError):
    """The outbox is installed with mode='required' and the enqueue ran outside a transaction."""

    code = "X_OUTBOX_NO_TX"


class SyncCallInLoopError(JobsError, RuntimeError):
    """A *_sync function was called on a thread running an event loop, which it would block."""

    code = "X_SYNC_IN_LOOP"


class WebhookDeliveryFailedError(JobsError):
    """A webhook attempt failed; it is retried on the job's backoff."""

    code = "X_WEBHOOK_DELIVERY_FAILED"


class WebhookDeliveryRejectedError(JobsError):
    """The endpoint refused the delivery for good (410 Gone or another permanent status)."""

    code = "X_WEBHOOK_DELIVERY_REJECTED"


class WebhookDeliveryThrottledError(JobsError):
    """The endpoint answered 429 or 503 with Retry-After; the retry waits that long."""

    code = "X_WEBHOOK_DELIVERY_THROTTLED"


class WebhookEndpointInvalidError(JobsError):
    """The endpoint cannot be delivered to (bad URL or secret, none found, or an SSRF refusal)."""

    code = "X_WEBHOOK_ENDPOINT_INVALID"


class WebhookEndpointDisabledError(JobsError):
    """The ledger holds the endpoint disabled; nothing was sent."""

    code = "X_WEBHOOK_ENDPOINT_DISABLED"


class WebhookEventMissingError(JobsError):
    """The delivery's event lookup found no event; nothing was sent."""

    code = "X_WEBHOOK_EVENT_MISSING"


class WebhookSignatureInvalidError(JobsError):
    """An inbound webhook's signature did not verify."""

    code = "X_WEBHOOK_SIGNATURE_INVALID"


class WebhookEventIdInvalidError(JobsError):
    """verify answered an event id that is not 1-256 printable ASCII characters."""

    code = "X_WEBHOOK_EVENT_ID_INVALID"


class WebhookReceiverUnavailableError(JobsError):
    """The receiver could not write the event's job; it answered 503 with Retry-After."""

    code = "X_WEBHOOK_RECEIVER_UNAVAILABLE"


class WebhookReceiverInvalidError(JobsError):
    """A webhook_receiver declaration has missing or bad fields."""

    code = "X_WEBHOOK_RECEIVER_INVALID"


class ExportPartTooLargeError(JobsError):
    """One page of an export encoded to more than max_part_bytes; no part was written for it."""

    code = "X_EXPORT_PART_TOO_LARGE"


class ExportRowInvalidError(JobsError):
    """row() answered a key not in columns, or a value the format cannot hold."""

    code = "X_EXPORT_ROW_INVALID"


class ImportRecordTooLargeError(JobsError):
    """A record of the imported file is longer than max_record_bytes (its line is named)."""

    code = "X_IMPORT_RECORD_TOO_LARGE"


class ImportHeaderMismatchError(JobsError):
    """A CSV file's header does not name exactly the declared columns, or names none at all."""

    code = "X_IMPORT_HEADER_MISMATCH"


class ImportTooManyErrorsError(JobsError):
    """An import refused more rows than max_row_errors allows; its refusals were written."""

    code = "X_IMPORT_TOO_MANY_ERRORS"


class ImportSourceChangedError(JobsError):
    """The object being imported answered fewer bytes than the size recorded at the start."""

    code = "X_IMPORT_SOURCE_CHANGED"


class StorageKeyInvalidError(JobsError):
    """An object key is empty, absolute, has an empty, '.' or '..' segment, or is malformed."""

    code = "X_STORAGE_KEY_INVALID"


class StorageNotFoundError(JobsError):
    """The object to import does not exist in the source."""

    code = "X_STORAGE_NOT_FOUND"


class BackfillSourceInvalidError(JobsError):
    """A backfill declares no source, both source= and pages=, or a page not (rows, next)."""

    code = "X_BACKFILL_SOURCE_INVALID"


class BackfillStalledError(JobsError):
    """A backfill's count() still answered rows to do after its last page."""

    code = "X_BACKFILL_STALLED"


class BackfillEnvironmentError(JobsError):
    """A backfill declared environments= and JOBS_ENV is not one of them."""

    code = "X_BACKFILL_ENVIRONMENT"


class BackfillMigrationPendingError(JobsError):
    """A backfill requires= a migration that is not applied."""

    code = "X_BACKFILL_MIGRATION_PENDING"


class ConsumerInvalidError(JobsError):
    """A consumer declaration has missing or bad fields."""

    code = "X_CONSUMER_INVALID"


class ConsumerSelfEnqueueError(JobsError):
    """A consumer's run enqueued its own consumer."""

    code = "X_CONSUMER_SELF_ENQUEUE"


class RollupInvalidError(JobsError):
    """A rollup declaration is wrong, or its into= table lacks the unique index on its key."""

    code = "X_JOB_ROLLUP_INVALID"


class RefreshViewInvalidError(JobsError):
    """A refresh_view names no materialized view, or concurrently=True lacks a unique index."""

    code = "X_JOB_REFRESH_VIEW_INVALID"


class SubjectDeclarationInvalidError(JobsError):
    """A define_subject declaration is wrong, or its table, key or columns are not in the database."""

    code = "X_SUBJECT_DECLARATION_INVALID"


class SubjectTableUndeclaredError(JobsError):
    """A table references the subject and has no declared treatment (the key path is named)."""

    code = "X_SUBJECT_TABLE_UNDECLARED"


class SubjectTreatmentInvalidError(JobsError):
    """A declared treatment cannot apply to its table as the database defines it."""

    code = "X_SUBJECT_TREATMENT_INVALID"


class SubjectCycleError(JobsError):
    """Deleted tables reference each other in a loop whose closing key cannot be cleared."""

    code = "X_SUBJECT_CYCLE"


class SubjectEraseBlockedError(JobsError):
    """A foreign key kept refusing the erase's deletes (new rows); retried on the backoff."""

    code = "X_SUBJECT_ERASE_BLOCKED"


ERROR_CLASSES: dict[str, type[JobsError]] = {cls.code: cls for cls in JobsError.__subclasses__()}


def error_class(code: str) -> type[JobsError]:
    """Answer the :class:`JobsError` subclass registered for ``code``.

    Raises:
        KeyError: the code is not in :data:`ERROR_CODES`.
    """
    return ERROR_CLASSES[code]


def classify(codes: Mapping[str, Classification]) -> None:
    """Register how the queue treats an application's own error codes.

    Args:
        codes: ``{"X_MY_CODE": "terminal" | "retry_after" | "retry"}``. An app error is matched by
            its ``code`` attribute (any exception class may carry one).

    Raises:
        ValueError: a classification other than the three named above.
    """
    for code, kind in codes.items():
        if kind not in ("terminal", "retry_after", "retry"):
            raise ValueError(
                f"classify: {code!r} must be 'terminal', 'retry_after' or 'retry', not {kind!r}"
            )
        _CLASSIFIED[code] = kind


def error_code(error: BaseException) -> str | None:
    """Answer the ``X_…`` code an exception carries (its ``code`` attribute), or ``None``."""
    code = getattr(error, "code", None)
    return code if isinstance(code, str) else None


def classification_of(error: BaseException) -> Classification:
    """Answer how the queue treats ``error`` raised by a job body.

    An error whose ``meta["terminal"]`` is ``True`` (a retry could only fail the same way),
    pydantic ``ValidationError``, ``PermissionError`` and registered terminal codes are terminal;
    a ``retry_after`` code needs ``meta["retry_after_seconds"]``; anything else retries.
    """
    from pydantic import ValidationError

    meta = getattr(error, "meta", None)
    if isinstance(meta, dict) and meta.get("terminal") is True:
        return "terminal"
    code = error_code(error)
    if code is not None and code in _CLASSIFIED:
        return _CLASSIFIED[code]
    if isinstance(error, ValidationError | PermissionError):
        return "terminal"
    return "retry"


def markdown_table() -> str:
    """Render :data:`ERROR_CODES` as the Markdown table the README carries."""
    lines = [
        "| Code | Class | Queue treats it as | Meaning | Fix |",
        "|---|---|---|---|---|",
    ]
    for entry in ERROR_CODES:
        lines.append(
            f"| `{entry.code}` | `{entry.class_name}` | {entry.classification} | "
            f"{entry.summary} | {entry.fix} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(markdown_table() + "\n")
