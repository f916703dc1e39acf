"""All of perdure's I/O: model providers, tools, the artifact store.

Workflows call these by their stable names (`perdure.workflows.shared.contracts.Activities`)
and never import this package.
"""
