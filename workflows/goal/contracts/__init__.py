"""The goal's contracts: the plan, the carried state and its migrations, user messages,
events, and the payloads of its own activities."""
