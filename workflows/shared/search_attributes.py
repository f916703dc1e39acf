"""Custom search attributes: the one list every server start registers.

The dev-server launcher, the test environments and docker-compose's setup job
all read `CUSTOM_SEARCH_ATTRIBUTES`; a workflow upserting an attribute the
server does not know gets stuck, so nothing may upsert a key missing here.
"""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

GOAL_STATUS = SearchAttributeKey.for_keyword("PerdureStatus")
PERCENT_DONE = SearchAttributeKey.for_int("PerdurePercentDone")
COST_USD = SearchAttributeKey.for_float("PerdureCostUsd")
PARKED = SearchAttributeKey.for_bool("PerdureParked")
NEEDS_HUMAN = SearchAttributeKey.for_bool("PerdureNeedsHuman")
LAST_PROGRESS_AT = SearchAttributeKey.for_datetime("PerdureLastProgressAt")
# Whose goal it is (runtime/settings.py user()), set when it starts: the router weighs a user's own.
OWNER = SearchAttributeKey.for_keyword("PerdureOwner")

ALL_KEYS = [GOAL_STATUS, PERCENT_DONE, COST_USD, PARKED, NEEDS_HUMAN, LAST_PROGRESS_AT, OWNER]

# Operator-API enum name (`INDEXED_VALUE_TYPE_<X>`) -> the type name the Temporal CLI uses.
CLI_TYPE = {
    "KEYWORD": "Keyword",
    "INT": "Int",
    "DOUBLE": "Double",
    "BOOL": "Bool",
    "DATETIME": "Datetime",
    "TEXT": "Text",
    "KEYWORD_LIST": "KeywordList",
}
# The other way round: what the operator API reports for a CLI type name.
INDEXED_VALUE_TYPE = {cli: enum for enum, cli in CLI_TYPE.items()}
CUSTOM_SEARCH_ATTRIBUTES: dict[str, str] = {k.name: CLI_TYPE[k.indexed_value_type.name] for k in ALL_KEYS}
