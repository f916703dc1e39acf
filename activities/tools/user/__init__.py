"""Your own tools: Python functions declared with `perdure.tool`, loaded by a worker or a
device, run under the same replay contract as the built-in tools.

- `tool_decorator.py`: the declaration (`perdure.tool`, `ToolCall`, `Undo`) and every check
  a declaration must pass on its own, raised when the module is imported;
- `tool_modules.py`: loading modules named on the command line or in config.toml and the
  `perdure.tools` entry point group, and the checks across tools (compensations, names);
- `toolbox.py`: what a worker loaded: the implementations, the offer, and the catalogue
  activity that tells a goal the tools it names (and their compensations);
- `user_tool_runs.py`: a declaration as the tool activity runs it (an `EffectTool` for a
  write, a `LocalTool` otherwise).

What a goal knows of them is data (workflows/shared/user_tools.py): the workflow never
imports a user's package.
"""
