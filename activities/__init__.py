"""All of perdure's I/O: model providers, tools, the artifact store.

Workflows call these by their stable names (`perdure.workflows.goal.contracts.goal_contracts.Activities`)
and never import this package, except the built-in tools' declarations
(`perdure.activities.tools.catalogue`), which are pure at import for that reason.
"""
