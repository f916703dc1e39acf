"""Pure logic more than one workflow uses: the graph, effect keys, budget arithmetic,
canonical forms, statuses, retries, the tool catalogue, and the payloads every side shares."""
