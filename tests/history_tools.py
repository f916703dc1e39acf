"""Reading facts out of real workflow histories in tests."""

from __future__ import annotations

import json

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.converter import default as default_converter

LOCAL_ACTIVITY_MARKER = "core_local_activity"


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


def local_activities(history: WorkflowHistory) -> list[tuple[int, str, str, int]]:
    """(event id, activity type, summary, completing workflow task's event id) for every
    local activity, which history records as a marker when its workflow task completes."""
    found = []
    for event in history.events:
        if event.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
            continue
        attrs = event.marker_recorded_event_attributes
        if attrs.marker_name != LOCAL_ACTIVITY_MARKER:
            continue
        data = json.loads(attrs.details["data"].payloads[0].data)
        found.append((event.event_id, data["activity_type"], _summary(event), attrs.workflow_task_completed_event_id))
    return found


def tool_timeline(history: WorkflowHistory) -> list[tuple[str, str]]:
    """("local" | "activity", summary) for every tool call, in history order."""
    timeline = []
    local = {event_id: summary for event_id, _, summary, _ in local_activities(history)}
    scheduled = {event_id: summary for event_id, _, summary in scheduled_activities(history)}
    for event in history.events:
        if event.event_id in local and local[event.event_id].startswith("tool "):
            timeline.append(("local", local[event.event_id]))
        elif event.event_id in scheduled and scheduled[event.event_id].startswith("tool "):
            timeline.append(("activity", scheduled[event.event_id]))
    return timeline


def activity_outcomes(history: WorkflowHistory, activity_type: str) -> tuple[int, int, list[int]]:
    """(scheduled, completed, attempts of the completed) for one activity type."""
    scheduled: set[int] = set()
    attempts: dict[int, int] = {}
    completed: list[int] = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if event.activity_task_scheduled_event_attributes.activity_type.name == activity_type:
                scheduled.add(event.event_id)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = event.activity_task_started_event_attributes
            attempts[attrs.scheduled_event_id] = attrs.attempt
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            sid = event.activity_task_completed_event_attributes.scheduled_event_id
            if sid in scheduled:
                completed.append(sid)
    return len(scheduled), len(completed), [attempts.get(sid, 0) for sid in completed]
