"""Reading facts out of real workflow histories in tests."""

from __future__ import annotations

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.converter import default as default_converter


def _summary(event) -> str:
    if not event.HasField("user_metadata") or not event.user_metadata.HasField("summary"):
        return ""
    return default_converter().payload_converter.from_payloads([event.user_metadata.summary])[0]


def scheduled_activities(history: WorkflowHistory) -> list[tuple[int, str, str]]:
    """(event id, activity type, summary) for every scheduled activity, in order."""
    found = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            found.append((event.event_id, attrs.activity_type.name, _summary(event)))
    return found


def started_attempts(history: WorkflowHistory) -> dict[int, int]:
    """Scheduled event id -> attempt number recorded when the activity last started."""
    return {
        e.activity_task_started_event_attributes.scheduled_event_id: e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    }


def completions(history: WorkflowHistory) -> list[tuple[int, int]]:
    """(completion event id, scheduled event id) for every activity that completed or failed, in order."""
    found = []
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            found.append((e.event_id, e.activity_task_completed_event_attributes.scheduled_event_id))
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            found.append((e.event_id, e.activity_task_failed_event_attributes.scheduled_event_id))
    return found


def largest_event_bytes(history: WorkflowHistory) -> int:
    return max(e.ByteSize() for e in history.events)
