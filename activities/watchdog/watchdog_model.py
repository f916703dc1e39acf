"""The watchdog's one model call per ambiguous goal and episode: the goal's text,
plan, recent conclusions and new-information figures in, the model's raw reply
out. The reply is parsed in the workflow (`watchdog_rules.parse_verdict`), so a
malformed one is recorded as such in history rather than hidden here.
"""

from __future__ import annotations

from temporalio import activity

from perdure.activities.models.one_call import ask_once
from perdure.activities.models.profiles import ModelConfig
from perdure.workflows.watchdog.watchdog_contracts import JudgeInput, JudgeResult, WatchdogActivities

SYSTEM = (
    "You are perdure's watchdog, an engineer judging whether a long-running goal makes real progress. "
    "PERDURE-WATCHDOG-JUDGE. Answer with one JSON object and nothing else: "
    '{"verdict": "healthy" | "spinning" | "drifting" | "stuck_on_person", "reason": "one sentence", '
    '"confidence": a number from 0 to 1}. spinning: steps finish but add little new information; '
    "drifting: finished steps do not serve the goal; stuck_on_person: it can only go on with a person's answer."
)


class WatchdogModelActivities:
    def __init__(self, config: ModelConfig) -> None:
        self.config = config

    def activities(self) -> list:
        return [self.judge]

    @activity.defn(name=WatchdogActivities.JUDGE)
    async def judge(self, input: JudgeInput) -> JudgeResult:
        profile = self.config.resolve(input.profile or "default")
        response = await ask_once(profile, SYSTEM, input.prompt, "watchdog judgement", json_mode=True)
        return JudgeResult(raw=response.text[:4000], tokens=response.input_tokens + response.output_tokens)
