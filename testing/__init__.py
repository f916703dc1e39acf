"""Test doubles and harnesses for perdure, installed with it (like `temporalio.testing`) but no
part of the runtime: the scripted model server, fake external services with ledgers, scratch
git repositories, and the crash harness that SIGKILLs real `perdure worker` processes.

Product code imports only `perdure.activities.models.scripted` (the `scripted` model provider of `perdure demo`);
nothing here may import from `tests/`. Import the submodules you need: this package's
`__init__` stays empty so that importing the scripted server loads no harness.
"""
