"""The trainer's half of a session over shared memory (spec §2): the control block, network regions and
replay-buffer regions, driven through the handshake tables of :mod:`protocol.controls`.

The engine's liveness is watched through the control block (it unlinks its regions when it ends, §2.1)
and, in spawned mode, the engine process (:mod:`trainer.system.liveness`); there every wait lasts as
long as the game lives (a paused editor included). In attach mode the block is ours; once the game has
raised ConfigSignal, the processes that map the block show it (:mod:`trainer.session.transport.mappers`, Linux),
and the waits follow them. Where they cannot be seen (another platform, a game run by another user) and
before any game came, each wait is bounded by ``Timeouts.wait`` (:class:`~trainer.session.transport.wait.WaitRule`);
which of the two runs is said in the log.

Attach mode can serve session after session (``serve``): :meth:`ShmTrainerLink.next_session` releases
the session's regions and puts the control block back to its initial state, and the wait for the next
game's config has no bound (a server waits for its clients; SIGINT/SIGTERM end it).
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from protocol.config import (
    SessionConfig,
    SharedMemoryConfig,
    check_shared_memory_config,
    parse_json,
    parse_shared_memory_config,
    session_from_shared_memory,
)
from protocol.controls import CONTROL_BLOCK_BYTES, Control, TrainerControls, init_controls, read_controls
from protocol.errors import ControlError, GuidError
from protocol.guid import os_shm_name, parse_guid, platform_guid_string
from protocol.names import FLOW_MATCHING, CommType, trainer_method
from protocol.replay import ReplayBuffer, ReplayLayout
from trainer.errors import BadData, Interrupted, LaunchError, PeerGone, WaitTimeout
from trainer.session.links.base import check_snapshot_size
from trainer.session.transport.files import CONFIG_FILE_LIMIT
from trainer.session.transport.mappers import GameWatch, game_watch
from trainer.session.transport.shm import SharedRegion, region_exists, unlink_orphaned
from trainer.session.transport.staging import ReplayStaging
from trainer.session.transport.wait import StopRequested, WaitRule, after_grace, wait_until
from trainer.settings.timeouts import WAIT_ADVICE, Timeouts
from trainer.system.console import log
from trainer.system.liveness import parent_watch
from trainer.system.lockfile import ControlBlockLock

__all__ = ["ShmTrainerLink"]

T = TypeVar("T")


class ShmTrainerLink:
    """Shared-memory link: the control block, the network regions and the replay-buffer regions.

    Spawned mode (``create=False``): the engine created the control block; it also watches the engine
    process, and waits have no bound. Attach mode (``create=True``, launched with ``-c``): we create the
    control block under the user's GUID and initialise it (the engine does the same when it maps it, spec
    §2.5); the game's liveness cannot be observed, so every wait is bounded by ``Timeouts.wait``,
    announced at the first wait.

    Args:
        config_dir: the folder the engine writes the config JSONs to, or the task directory above its
            ``Configs`` folder.
        controls_guid: the ``-g`` GUID string (attach mode: any FGuid::Parse format; it is normalised).
        create: attach mode (``-c``): create the control block instead of opening the engine's.
        timeouts: every wait's bound; defaults to :class:`Timeouts` ().
        platform: ``sys.platform`` value naming the regions (tests only).
        watch_parent: the engine spawned us: watch it, and wait without a bound while it lives (default:
            spawned mode, i.e. not ``create``).
        interrupted: polled during waits; True (SIGINT/SIGTERM seen by the app) raises ``Interrupted``.
        serve: attach mode serving session after session: the wait for a game's config has no bound
            (:meth:`next_session` prepares the next one).
        output: where the link's log lines go (tests capture them).
    """

    comm_type = CommType.SHARED_MEMORY
    """See :attr:`TrainerLink.comm_type <trainer.session.links.base.TrainerLink.comm_type>`."""

    def __init__(
        self,
        config_dir: str | os.PathLike[str],
        controls_guid: str,
        *,
        create: bool = False,
        timeouts: Timeouts | None = None,
        platform: str | None = None,
        watch_parent: bool | None = None,
        interrupted: Callable[[], bool] | None = None,
        serve: bool = False,
        output: Callable[[str], None] = log,
    ) -> None:
        if serve and not create:
            raise LaunchError(
                "serving session after session needs attach mode (--create): a control block the engine "
                "created goes away with the engine"
            )
        self._timeouts = timeouts or Timeouts()
        self._created = create
        self._serve = serve
        self._say = output
        self._config_seen = False
        self._interrupted = interrupted
        self._platform = platform or sys.platform
        self._config_path = Path(config_dir)
        try:
            guid = parse_guid(controls_guid)
            # Attach mode: the engine names the block with its own platform string of the parsed GUID,
            # so normalise what the user typed. Spawned mode: use the engine's string byte for byte
            # (names are case-sensitive; no conversion can get it wrong).
            self._guid_string = platform_guid_string(guid, self._platform) if create else controls_guid
            self._controls_name = os_shm_name(self._guid_string, self._platform)
        except GuidError as error:
            raise LaunchError(f"the controls GUID {controls_guid!r} cannot be used: {error}") from None
        self._regions: list[SharedRegion] = []
        self._network_regions: dict[int, SharedRegion] = {}
        self._replay_views: dict[int, dict[str, memoryview]] = {}
        self._layouts: dict[int, ReplayLayout] = {}
        # Destination of the next shared-memory replay buffer, pre-faulted while we wait (staging.py).
        self._staging: ReplayStaging | None = None
        self._config: SessionConfig | None = None
        self._stopped = False
        self._closed = False
        # Sync rounds go out from the sender's thread (trainer.session.sender) while training polls for
        # Stop: seeing (and clearing) a Stop and posting a network are one step each, never interleaved,
        # so no network is posted after the Stop was taken.
        self._controls_lock = threading.RLock()
        # One trainer per control block (trainer/system/lockfile.py); taken before the block is touched, so a
        # second trainer never clears a signal the first one is waiting on.
        self._lock = ControlBlockLock(self._guid_string)
        try:
            if create:
                self._control_region = SharedRegion.create(
                    self._controls_name, CONTROL_BLOCK_BYTES, label="control block"
                )
                init_controls(self._control_region.buf)
            else:
                self._control_region = SharedRegion.open(
                    self._controls_name, CONTROL_BLOCK_BYTES, label=f"control block {self._guid_string}"
                )
        except BaseException:
            self._lock.release()
            raise
        self._controls = TrainerControls(self._control_region.buf)
        watching = watch_parent if watch_parent is not None else not create
        self._parent_alive = parent_watch() if watching else None
        self._rule = WaitRule(
            self._timeouts,
            visible=watching,
            why_unseen="attach mode (-c)" if create else "the trainer was not started by the game",
            output=output,
        )
        # Attach mode: who maps our control block shows the game's liveness (found once it has come). The
        # watch is made now, before any game: on Windows it counts this trainer's own handles first.
        self._game_watch: GameWatch | None = (
            game_watch(self._controls_name, self._platform) if create else None
        )
        self._mappers: GameWatch | None = None
        self._next_peer_check = time.monotonic() + self._timeouts.peer_check_interval

    @property
    def wait_bound(self) -> float:
        """Seconds the link's next wait on the game may last: ``math.inf`` where it sees the game alive,
        else ``Timeouts.wait`` (:class:`~trainer.session.transport.wait.WaitRule`)."""
        return self._rule.bound

    @property
    def guid_string(self) -> str:
        """The controls GUID as the engine prints it (attach mode: give this to the game)."""
        return self._guid_string

    @property
    def config_dir(self) -> Path:
        """Where the config files are read from (resolved when read: attach mode may create it late)."""
        return _config_folder(self._config_path)

    # -- waiting ---------------------------------------------------------------------------------------

    @property
    def in_session(self) -> bool:
        """A game has raised ConfigSignal in this session (before that, the link only waits for one)."""
        return self._config_seen

    def _peer_alive(self) -> bool:
        if self._parent_alive is not None and not self._parent_alive():
            return False
        if self._mappers is not None and not self._mappers.alive():
            return False  # every process of the game that mapped our block has unmapped it: it is gone
        # The engine unlinks the regions it created when it ends (spec §2.1); ours stays while we run.
        return region_exists(self._controls_name)

    def _wait(
        self,
        predicate: Callable[[], T | None],
        what: str,
        *,
        interruptible: bool = True,
        rule: WaitRule | None = None,
    ) -> T:
        # Sends give a signal a grace period: a SIGINT/SIGTERM in the middle of a round would leave the
        # engine blocked in ReceiveNetwork for the rest of it (an error there, spec §7.1). The round
        # finishes and the loop stops at the next step boundary; a game that does not take the network
        # within Timeouts.signal_grace (paused, stuck) no longer keeps the signalled trainer alive.
        rule = rule or self._rule
        return wait_until(
            predicate,
            timeout=rule.start(what),
            what=what,
            timeout_hint=rule.hint,
            notice=rule.notice(what),
            notice_after=self._timeouts.notice_after,
            poll_interval=self._timeouts.poll_interval,
            peer_alive=self._peer_alive,
            stop=self._stop_seen,
            peer_check_interval=self._timeouts.peer_check_interval,
            interrupted=(
                self._interrupted
                if interruptible
                else after_grace(self._interrupted, self._timeouts.signal_grace)
            ),
            on_poll=self._prepare_staging,
        )

    def _prepare_staging(self) -> None:
        # Every wait after the config (networks, experience) spends its idle polls faulting in the
        # replay buffer's destination, so the copy-out runs at memory speed (staging.py).
        if self._staging is not None:
            self._staging.advance()

    def _new_staging(self) -> None:
        # Only for the single buffer flow matching uses (§2.2); with several, which one comes next
        # is unknown and staging them all would fault in memory that may never be used.
        if self._staging is None and len(self._layouts) == 1:
            ((rb_id, layout),) = self._layouts.items()
            self._staging = ReplayStaging(layout, self._replay_views[rb_id])

    # -- the session -----------------------------------------------------------------------------------

    def _wait_for_config(self) -> None:
        if self._config_seen:
            return
        what = f"the game's config (ConfigSignal on control block {self._guid_string})"
        if self._serve:
            # A server waits for its next client without a bound; the signals end it.
            self._say(
                f"la-trainer: serving session after session on control block {self._guid_string}: waiting "
                "for a game with no bound (SIGINT/SIGTERM stop the server; --once: one session only)."
            )
            idle = WaitRule(
                replace(self._timeouts, wait=math.inf),
                visible=False,
                why_unseen="serving",
                output=self._say,
                serving=True,
            )
            self._wait(self._controls.config_ready, what, rule=idle)
        else:
            self._wait(self._controls.config_ready, what)
        self._config_seen = True
        if self._created:
            self._watch_game()

    def _watch_game(self) -> None:
        """Attach mode, the game has raised ConfigSignal: follow the processes that map our control block
        if they can be seen (then waits have no bound), else keep the bound; say which."""
        bound = self._timeouts.wait
        watch = self._game_watch
        if watch is None:
            self._say(
                f"la-trainer: this platform does not show which processes map the control block, so the "
                f"game's liveness cannot be seen: each wait on it stays bounded by {bound:g} s; {WAIT_ADVICE}."
            )
            return
        if not watch.attach():
            self._say(
                f"la-trainer: no other process of this user maps the control block {self._controls_name} "
                f"(a game run by another user cannot be seen): each wait on the game stays bounded by "
                f"{bound:g} s; {WAIT_ADVICE}."
            )
            return
        self._mappers = watch
        self._rule = WaitRule(self._timeouts, visible=True, output=self._say)
        self._say(
            f"la-trainer: {watch.describe()}: waits follow it with no bound, and its end is noticed within "
            f"{self._timeouts.peer_check_interval:g} s."
        )

    def peek_trainer_method(self) -> str:
        """Wait for ConfigSignal and return ``TrainerMethod`` from trainer-config.json WITHOUT acknowledging.

        For the hand-over of other methods to the engine's own ``train.py`` (:func:`trainer.dropin.handover.
        keep_flow_matching`):
        ConfigSignal stays 1, so the engine's script finds the config as the engine posted it. A missing
        key means the engine default, :data:`FLOW_MATCHING`; the file's other content is checked by
        :meth:`receive_config`, which then returns at once (the signal is still raised).
        """
        self._wait_for_config()
        path = self.config_dir / "trainer-config.json"
        obj = parse_json(_read_config_file(path), path.name)
        method = trainer_method(obj)
        return FLOW_MATCHING if method is None else method

    def receive_config(self) -> SessionConfig:
        """Wait for ConfigSignal, read the three files (§2.4), acknowledge, map every region."""
        self._wait_for_config()
        folder = self.config_dir
        shm_path = folder / f"shared-memory-{self._guid_string}.json"
        if not shm_path.is_file():
            others = sorted(p.name for p in folder.glob("shared-memory-*.json")) if folder.is_dir() else []
            raise LaunchError(
                f"the game raised ConfigSignal but {shm_path} does not exist"
                + (f" (the folder holds {', '.join(others)})" if others else "")
                + ". Check that the trainer and the game use the same config folder and controls GUID."
            )
        shm_obj = parse_json(_read_config_file(shm_path), shm_path.name)
        data_obj = parse_json(_read_config_file(folder / "data-config.json"), "data-config.json")
        trainer_obj = parse_json(_read_config_file(folder / "trainer-config.json"), "trainer-config.json")
        config = session_from_shared_memory(trainer_obj, data_obj)
        shm_config = parse_shared_memory_config(shm_obj, source=shm_path.name)
        check_shared_memory_config(config, shm_config)
        # Acknowledge before mapping: the engine does not wait for it (§2.4), and the files are read.
        self._controls.ack_config()
        self._map_regions(config, shm_config)
        self._config = config
        return config

    def _map_regions(self, config: SessionConfig, shm: SharedMemoryConfig) -> None:
        for net in config.model.networks:
            guid = shm.network_guid(net.id)
            region = self._open(guid, net.max_byte_num, f"network {net.id} ({net.name}) region {guid}")
            self._network_regions[net.id] = region
        for rb in config.data.replay_buffers:
            layout = ReplayLayout.from_config(rb)
            guids = shm.replay_buffers[rb.id].by_region_name()
            views: dict[str, memoryview] = {}
            for spec in layout.regions():
                guid = guids.get(spec.name, "")
                if not guid:
                    raise LaunchError(
                        f"shared-memory-{self._guid_string}.json names no region for replay buffer {rb.id} "
                        f"{spec.name}, which the data config says exists"
                    )
                region = self._open(guid, spec.nbytes, f"replay buffer {rb.id} {spec.name} region {guid}")
                views[spec.name] = region.buf
            self._layouts[rb.id] = layout
            self._replay_views[rb.id] = views
        self._new_staging()

    def _open(self, guid: str, size: int, label: str) -> SharedRegion:
        try:
            name = os_shm_name(guid, self._platform)
        except GuidError as error:
            raise LaunchError(f"the {label} has an unusable GUID: {error}") from None
        region = SharedRegion.open(name, size, label=label)
        self._regions.append(region)
        return region

    def _require_config(self, what: str) -> SessionConfig:
        if self._config is None:
            raise ControlError(f"{what} needs the config first (call receive_config)", field=what)
        return self._config

    def receive_network(self, network_id: int) -> bytes:
        """Request network ``network_id`` and copy its region once the engine has filled it (§2.4)."""
        config = self._require_config("receive_network")
        region = self._network_regions.get(network_id)
        if region is None:
            raise ControlError(
                f"network {network_id} is not in the config",
                field="network_id",
                expected=sorted(self._network_regions),
                actual=network_id,
            )
        self._controls.request_network(network_id)
        self._wait(
            lambda: self._controls.network_received(network_id),
            f"network {network_id} ({config.network(network_id).name}) from the game",
        )
        return bytes(region.buf)

    def receive_experience(self) -> ReplayBuffer:
        """Wait for ExperienceSignal, copy the first E/S rows out of the regions, acknowledge (§2.4)."""
        self._require_config("receive_experience")
        self._new_staging()
        info = self._wait(self._controls.experience_ready, "the replay buffer from the game")
        layout = self._layouts.get(info.replay_buffer_id)
        if layout is None:
            raise ControlError(
                f"ReplayBufferId {info.replay_buffer_id} is not a replay buffer of the config",
                field="REPLAY_BUFFER_ID",
                expected=sorted(self._layouts),
                actual=info.replay_buffer_id,
            )
        views = self._replay_views[info.replay_buffer_id]
        # Ids, counts and region sizes checked before anything is copied (zero-copy views, dropped here).
        layout.read_regions(views, info.episode_num, info.step_num, info.replay_buffer_id)
        staging, self._staging = self._staging, None
        if staging is None or staging.layout.replay_buffer_id != info.replay_buffer_id:
            staging = ReplayStaging(layout, views)  # nothing pre-faulted: the copy faults as it goes
        copied = staging.copy_out(info.episode_num, info.step_num, info.replay_buffer_id)
        self._controls.ack_experience()
        return copied

    def send_network(self, network_id: int, data: bytes, version: int) -> None:
        """Wait until the engine took the previous network, write region ``network_id``, publish it.

        ``version`` has no place in the control block (it is a socket field) and is ignored.
        """
        config = self._require_config("send_network")
        region = self._network_regions.get(network_id)
        if region is None:
            raise ControlError(
                f"network {network_id} is not in the config", field="network_id", actual=network_id
            )
        check_snapshot_size(network_id, data, config.network(network_id).max_byte_num)
        self._wait(
            self._controls.can_send_network,
            f"the game to take the previous network before network {network_id} (NetworkSignal back to 0)",
            interruptible=False,
        )
        with self._controls_lock:
            if self._stop_seen():
                raise StopRequested(
                    f"the game asked the trainer to stop while network {network_id} was waiting to go out"
                )
            region.buf[:] = data
            self._controls.post_network(network_id)

    def send_complete(self) -> None:
        """CompleteSignal = 1, once the engine has taken the last network.

        Waiting first matters: the engine tests CompleteSignal before NetworkSignal, so a Complete raised
        while network 2 is still pending would make it skip loading that network (spec §2.4).
        """
        self._wait(
            self._controls.can_send_network,
            "the game to take the last network before Complete (NetworkSignal back to 0)",
            interruptible=False,
        )
        self._controls.post_complete()

    def stop_requested(self) -> bool:
        """True once StopSignal was seen; it is cleared right away (the engine does not wait, §2.4).

        Raises:
            PeerGone: the engine is gone (checked every ``peer_check_interval`` seconds). The training
                loop polls this between steps, so a game that dies while we train (no wait is running)
                is noticed within that interval instead of at the next sync round.
        """
        if self._stop_seen():
            return True
        if self._closed:
            return False
        now = time.monotonic()
        if now >= self._next_peer_check:
            self._next_peer_check = now + self._timeouts.peer_check_interval
            if not self._peer_alive():
                raise PeerGone("the engine went away during training")
        return False

    def _stop_seen(self) -> bool:
        """StopSignal seen (and cleared); waits poll this (they check the peer themselves)."""
        if self._stopped:
            return True
        if self._closed:
            return False
        with self._controls_lock:
            if not self._stopped and self._controls.stop_requested():
                self._controls.clear_stop()
                self._stopped = True
        return self._stopped

    def ping(self) -> None:
        """PingSignal = 1: a waiting engine resets its timeout clock (a single int32 store)."""
        if not self._closed:
            self._controls.ping()

    def finish(self, timeout: float) -> None:
        """Wait for the engine to take Complete: as long as it lives in spawned mode, at most ``timeout``
        s in attach mode. Shared memory has no exit race (§10 item 7): giving up loses nothing.

        The game may end training with Stop instead of taking Complete (EndTraining racing our last
        round), and the user may signal us: both end the wait at once, like every other wait."""
        if self._closed:
            return
        try:
            wait_until(
                lambda: read_controls(self._control_region.buf)[Control.COMPLETE_SIGNAL] == 0,
                timeout=timeout if not self._rule.visible else self._rule.bound,
                what="the game to take Complete",
                poll_interval=max(self._timeouts.poll_interval, 0.001),
                peer_alive=self._peer_alive,
                peer_check_interval=self._timeouts.peer_check_interval,
                stop=self._stop_seen,
                interrupted=self._interrupted,
            )
        except (WaitTimeout, PeerGone, StopRequested, Interrupted):
            pass  # Complete stays in the block; nothing else to do for us.

    def _release_session(self) -> None:
        """Unmap the session's network and replay regions (the game's; it unlinks them)."""
        regions, self._regions = self._regions, []
        self._network_regions.clear()
        self._replay_views.clear()
        self._layouts.clear()
        self._staging = None
        for region in regions:
            region.close()

    def next_session(self) -> None:
        """Attach mode, serving: end this session and wait for the next game from a clean block.

        The session's regions are released, the control block is put back to its initial state (every
        signal 0, NetworkId = ReplayBufferId = -1: what the engine writes when it maps it, §2.5) and a
        fresh trainer half of the handshakes starts; the next game's liveness is looked up again once it
        raises ConfigSignal. The lock and the block itself stay ours.
        """
        if not self._created or self._closed:
            raise LaunchError("only an open attach-mode link can serve another session")
        self._release_session()
        self._config = None
        self._stopped = False
        self._config_seen = False
        self._mappers = None
        init_controls(self._control_region.buf)
        self._controls = TrainerControls(self._control_region.buf)
        self._rule = WaitRule(self._timeouts, visible=False, why_unseen="attach mode (-c)", output=self._say)

    def close(self) -> None:
        """Unmap every region; unlink the control block only if we created it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        orphans = self._orphaned_region_names()
        try:
            self._release_session()
        finally:
            try:
                if self._game_watch is not None:
                    self._game_watch.close()
                self._control_region.close()
            finally:
                self._lock.release()
                for name in orphans:
                    unlink_orphaned(name)

    def _orphaned_region_names(self) -> list[str]:
        """The engine's regions we map, when the engine that spawned us is dead: killed, it never
        unlinked them (spec 2.1: the creator unlinks) and nobody else will, so its trainer does."""
        if self._parent_alive is None or self._parent_alive():
            return []
        names = [region.name for region in self._regions]
        return names if self._created else [*names, self._control_region.name]

    def __enter__(self) -> ShmTrainerLink:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _config_folder(path: Path) -> Path:
    """Accept the task directory as well as its ``Configs`` folder (the 5.6/5.7 layout, spec §2.5)."""
    if path.name != "Configs" and (path / "Configs").is_dir():
        return path / "Configs"
    return path


def _read_config_file(path: Path) -> bytes:
    """One config file the engine wrote, read whole after a size check; every failure names the file."""
    try:
        size = path.stat().st_size
        if size > CONFIG_FILE_LIMIT:
            raise BadData(f"{path} is {size} bytes; config files are at most {CONFIG_FILE_LIMIT} bytes")
        return path.read_bytes()
    except FileNotFoundError:
        raise LaunchError(
            f"the config file {path} does not exist although the game raised ConfigSignal. Check that the "
            "trainer reads the folder the game writes to (-LearningAgentsConfigPath in attach mode, "
            "<task dir>/Configs when the game spawns the trainer)."
        ) from None
    except OSError as error:
        # A directory, a permission problem or an I/O error: name the file, never a traceback.
        raise LaunchError(f"the config file {path} cannot be read: {error.strerror or error}.") from None
