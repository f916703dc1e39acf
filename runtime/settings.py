"""Where things are, read from the environment. Worker- and CLI-side only.

PERDURE_HOME        state on this machine (artifacts by default), default ~/.perdure
PERDURE_ARTIFACT_STORE  where artifacts are kept: unset, $PERDURE_HOME/artifacts; an absolute
                    path, that directory; s3://bucket/prefix, an S3-compatible object store
                    reached through the standard AWS variables (runtime/s3_client.py)
PERDURE_TEMPORAL    Temporal frontend address (overrides the Temporal profile's)
PERDURE_NAMESPACE   Temporal namespace (overrides the Temporal profile's)
PERDURE_TASK_QUEUE  task queue of the orchestrator workers, default "perdure"
PERDURE_DEPLOYMENT  Temporal Worker Deployment the orchestrator workers belong to, default "perdure"
PERDURE_WORKFLOW_CACHE  workflow runs an orchestrator worker keeps in memory, default 1000
PERDURE_UI          Temporal UI base URL, default http://localhost:8233
PERDURE_CONFIG      model profiles file, default $PERDURE_HOME/config.toml
PERDURE_PAYLOAD_STORE            large payloads outside history, default $PERDURE_HOME/payloads
                                 (s3://bucket/prefix/payloads when the artifact store is s3://bucket/prefix)
PERDURE_PAYLOAD_THRESHOLD_BYTES  size from which a payload goes there, default 128 KiB
                                 (both read by runtime/converter.py, which documents them)
PERDURE_PAYLOAD_KEYS             id:base64key,... (newest last): payloads in history and the
PERDURE_PAYLOAD_KEY_FILE         files at rest are encrypted; unset, they are not
                                 (read by runtime/codec.py, which documents them)

The Temporal server is also found the standard way, as every Temporal SDK and
the `temporal` CLI find it (`temporalio.envconfig`): a profile file
(TEMPORAL_CONFIG_FILE, else ~/.config/temporalio/temporal.toml on Linux), the
profile TEMPORAL_PROFILE (else "default"), then the TEMPORAL_* variables
(TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TEMPORAL_TLS,
TEMPORAL_TLS_CLIENT_CERT_PATH, ...) on top of it. For the address and the
namespace, PERDURE_* wins over all of that, and localhost:7233 and "default" are
used where nothing says. runtime/connect.py turns the rest (API key, TLS, gRPC
metadata) into the client's connection.
"""

from __future__ import annotations

import getpass
import os
import re
from pathlib import Path
from urllib.parse import quote

from temporalio.envconfig import ClientConfigProfile

from perdure.runtime.s3_client import S3Location, parse_s3_url
from perdure.workflows.goal.contracts.goal_contracts import GOAL_WORKFLOW
from perdure.workflows.shared.contracts import TASK_QUEUE

DEFAULT_TEMPORAL_ADDRESS = "localhost:7233"
DEFAULT_NAMESPACE = "default"
DEFAULT_PROFILE = "default"
CONFIG_FILE_ENV = "TEMPORAL_CONFIG_FILE"
PROFILE_ENV = "TEMPORAL_PROFILE"
# No "." in it: Temporal writes a version as `<deployment>.<build id>`.
DEFAULT_DEPLOYMENT = "perdure"
# The SDK's own default. A goal out of the cache replays its whole run on its next
# workflow task, so the cache should hold every goal a worker serves: a cached goal
# costs about half a megabyte (docs/operations/benchmarks.md), a replay up to seconds for a long run.
DEFAULT_WORKFLOW_CACHE = 1000
WORKFLOW_CACHE_ENV = "PERDURE_WORKFLOW_CACHE"


class TemporalConfigError(RuntimeError):
    """The Temporal client configuration (profile file, TEMPORAL_* variables) cannot be used as it is."""


class HomeUnusable(ValueError):
    """PERDURE_HOME (or ~/.perdure) cannot hold perdure's state: something on its path is a file."""


ARTIFACT_STORE_ENV = "PERDURE_ARTIFACT_STORE"


class ArtifactStoreConfigError(ValueError):
    """PERDURE_ARTIFACT_STORE has a value perdure cannot use."""


def perdure_home() -> Path:
    return Path(os.environ.get("PERDURE_HOME") or Path.home() / ".perdure").expanduser()


def artifact_location() -> Path | S3Location:
    """Where the artifact store is (PERDURE_ARTIFACT_STORE): a directory, or a bucket and prefix.
    Reads the setting only; ArtifactStoreConfigError for one that cannot be used."""
    value = os.environ.get(ARTIFACT_STORE_ENV, "").strip()
    if not value:
        return perdure_home() / "artifacts"
    if value.startswith("s3://"):
        try:
            return parse_s3_url(value, ARTIFACT_STORE_ENV)
        except ValueError as err:
            raise ArtifactStoreConfigError(str(err)) from None
    if "://" in value:
        raise ArtifactStoreConfigError(
            f"{ARTIFACT_STORE_ENV}={value!r} is not understood; use an absolute directory or s3://bucket/prefix"
        )
    directory = Path(value).expanduser()
    if not directory.is_absolute():
        raise ArtifactStoreConfigError(
            f"{ARTIFACT_STORE_ENV}={value!r}: the directory must be an absolute path, so that workers "
            "and the CLI resolve it the same way"
        )
    return directory


def check_home() -> None:
    """Refuse a home that is, or lies below, a file: every command that keeps or reads state
    there (artifacts, payloads, memory, the dev server's data) would fail deep inside."""
    home = perdure_home()
    blocking = next((p for p in (home, *home.parents) if p.exists() or p.is_symlink()), None)
    if blocking is None or blocking.is_dir():
        return
    named = f"PERDURE_HOME={home}" if os.environ.get("PERDURE_HOME") else f"perdure's home {home}"
    raise HomeUnusable(
        f"{named} cannot be used: {blocking} is a file, not a directory. Point PERDURE_HOME at a directory "
        "(perdure keeps its state there; it is made when missing), or unset it for ~/.perdure"
    )


def temporal_profile() -> ClientConfigProfile:
    """The Temporal client profile: the profile file's entry with the TEMPORAL_* variables applied.

    No file and no variables is not an error (an empty profile). A named file that
    is missing, a named profile the file lacks, or a file that is not valid TOML is.
    """
    config_file = os.environ.get(CONFIG_FILE_ENV, "")
    # The SDK treats a missing file as an empty one: a typo would silently connect elsewhere.
    if config_file and not Path(config_file).expanduser().is_file():
        raise TemporalConfigError(f"{CONFIG_FILE_ENV}={config_file}: no such file")
    try:
        # An explicit path, since the SDK does not expand `~`; None lets it find the default file.
        source = Path(config_file).expanduser() if config_file else None
        return ClientConfigProfile.load(config_source=source)
    except RuntimeError as err:
        where = config_file or "the default Temporal config file"
        profile = os.environ.get(PROFILE_ENV) or DEFAULT_PROFILE
        raise TemporalConfigError(
            f"cannot load Temporal profile {profile!r} from {where} and the TEMPORAL_* variables: {err}"
        ) from None


def temporal_address(profile: ClientConfigProfile | None = None) -> str:
    """PERDURE_TEMPORAL, else the Temporal profile's address, else localhost:7233."""
    return os.environ.get("PERDURE_TEMPORAL") or (profile or temporal_profile()).address or DEFAULT_TEMPORAL_ADDRESS


def namespace(profile: ClientConfigProfile | None = None) -> str:
    """PERDURE_NAMESPACE, else the Temporal profile's namespace, else "default"."""
    return os.environ.get("PERDURE_NAMESPACE") or (profile or temporal_profile()).namespace or DEFAULT_NAMESPACE


def task_queue() -> str:
    return os.environ.get("PERDURE_TASK_QUEUE", TASK_QUEUE)


def workflow_cache() -> int:
    """How many workflow runs an orchestrator worker keeps in memory (PERDURE_WORKFLOW_CACHE)."""
    raw = os.environ.get(WORKFLOW_CACHE_ENV, "").strip()
    if not raw:
        return DEFAULT_WORKFLOW_CACHE
    if not raw.isdigit():
        raise ValueError(f"{WORKFLOW_CACHE_ENV} must be a whole number of workflow runs (0: none kept), not {raw!r}")
    return int(raw)


def deployment_name() -> str:
    """The Worker Deployment whose versions `perdure worker` registers (workers/deployment.py)."""
    return os.environ.get("PERDURE_DEPLOYMENT") or DEFAULT_DEPLOYMENT


def user() -> str:
    """Whose router a message goes to: PERDURE_USER, else the login name, as an id may
    spell it (letters, digits, `.`, `_`, `-`)."""
    try:
        raw = os.environ.get("PERDURE_USER") or getpass.getuser() or "user"
    except (OSError, KeyError):  # no login name (a container's bare uid): every message still goes
        raw = "user"
    name = re.sub(r"[^A-Za-z0-9._-]", "-", raw).strip("-._")[:64]
    return name or "user"


def ui_base() -> str:
    return os.environ.get("PERDURE_UI", "http://localhost:8233").rstrip("/")


def config_path() -> Path:
    return Path(os.environ.get("PERDURE_CONFIG") or perdure_home() / "config.toml").expanduser()


def goal_ui_link(goal_id: str, run_id: str | None = None) -> str:
    """A goal's page in the Temporal UI (also any workflow's: a watchdog run's). Without a run
    id the UI opens the latest run, which follows a goal through continue-as-new; with one,
    that run's history. A page under the id (`/history`, `/pending-activities`) needs the run
    id in the path: without it the UI reads the page's name as the run id and answers 400."""
    workflow = f"{ui_base()}/namespaces/{quote(namespace(), safe='')}/workflows/{quote(goal_id, safe='')}"
    return f"{workflow}/{quote(run_id, safe='')}/history" if run_id else workflow


def schedule_ui_link(schedule_id: str) -> str:
    return f"{ui_base()}/namespaces/{quote(namespace(), safe='')}/schedules/{quote(schedule_id, safe='')}"


# The saved view of goals: the list without the watchdog's runs (one a minute per task
# queue, each a WatchdogWorkflow), by the built-in WorkflowType attribute.
GOALS_VIEW_QUERY = f'WorkflowType = "{GOAL_WORKFLOW}"'


def goals_ui_link() -> str:
    """The UI's workflow list showing goals only (save it as a view in the UI)."""
    return f"{ui_base()}/namespaces/{quote(namespace(), safe='')}/workflows?query={quote(GOALS_VIEW_QUERY, safe='')}"


def dev_server_ports() -> tuple[int, int]:
    """Frontend and UI ports for the embedded server, taken from PERDURE_TEMPORAL and PERDURE_UI.

    Not from the Temporal profile: that names the server perdure connects to, which
    need not be this machine's.
    """
    frontend = os.environ.get("PERDURE_TEMPORAL", DEFAULT_TEMPORAL_ADDRESS).rpartition(":")[2]
    ui = ui_base().rpartition(":")[2]
    return int(frontend) if frontend.isdigit() else 7233, int(ui) if ui.isdigit() else 8233
