"""A room that follows the instructor, live: the instructor opens a room and gets a short code; every page that
joins it (`?room=CODE`) shows the instructor's run at the instructor's cycle, phase and picked token, and can
step away and come back (its "follow" switch).

    Rooms()                      the server's rooms, one object per app (no module-level state)
    Rooms.open()                 a new room's code: five letters without look-alikes (no 0/O, 1/I/L)
    Rooms.show(code, run, ...)   the instructor's page shows this picture now: the room's next version
    Rooms.seen(code)             the room's picture (a `Shown`), or None for a room that is not (or no longer) there
    Rooms.drawn(room, draw)      the room's picture drawn once per version, for every follower

A follower's page asks the room's version (one number) a few times a second and fetches the picture only when
the version moved; the figures come from the instructor's RunTrace, shared read-only, so a follower does no model
work, recorded run or live run alike (a live run's trace grows while it is shown: a cycle once recorded never
changes). The view values of a version are drawn once, by the first follower that asks, and handed to the others
(`Shown.drawn`); the followers asking while it draws wait for it (thirty asking at once would otherwise draw it
side by side). A room its instructor has left (no picture shown for `ttl_s`) ends by itself: its followers are
told, once.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from eagleviz.trace import RunTrace

CODE_LETTERS = "ABCDEFGHJKMNPQRSTUVWXYZ"   # no I, L, O: read aloud and typed from a projector
CODE_CHARS = 5
ROOM_TTL_S = 2 * 3600                      # a room untouched this long (its instructor gone) ends
MAX_ROOMS = 256                            # a public server is not a room directory: the oldest go first


@dataclass
class Shown:
    """What a room shows: the instructor's run, cycle, phase frame (None: the end state) and picked slot, at
    `version` (one more at each change). `drawn`: the view values of this version, once a follower drew them;
    `drawing`: held while a follower draws them."""

    run: RunTrace | None = None
    cycle: int = 0
    frame: int | None = None
    slot: int | None = None
    cycles: int = 0          # the run's cycles when shown: a live run's growth is a change too
    version: int = 0
    touched: float = 0.0
    drawn: tuple | None = field(default=None, repr=False)
    drawing: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)


class Rooms:
    """The open rooms, by code. Thread-safe: the instructor's and the followers' events arrive side by side."""

    def __init__(self, ttl_s: float = ROOM_TTL_S, clock: Callable[[], float] = time.monotonic,
                 max_rooms: int = MAX_ROOMS):
        self.ttl_s, self._clock, self.max_rooms = ttl_s, clock, max_rooms
        self._lock = threading.Lock()
        self._rooms: dict[str, Shown] = {}

    def open(self) -> str:
        """A new room (nothing shown yet): its code."""
        with self._lock:
            self._sweep()
            while len(self._rooms) >= self.max_rooms:
                del self._rooms[min(self._rooms, key=lambda c: self._rooms[c].touched)]
            code = self._new_code()
            self._rooms[code] = Shown(touched=self._clock())
            return code

    def _new_code(self) -> str:
        while True:
            code = "".join(secrets.choice(CODE_LETTERS) for _ in range(CODE_CHARS))
            if code not in self._rooms:
                return code

    def show(self, code: str | None, run: RunTrace | None, cycle: float | None, frame: float | None,
             slot: int | None) -> bool:
        """The instructor's page shows this picture: followers see it next. False when the room has ended."""
        with self._lock:
            self._sweep()
            room = self._rooms.get(str(code or "").upper())
            if room is None:
                return False
            grown = len(run.cycles) if run is not None else 0   # a live run's new cycles: its text and slider grow
            picture = (int(cycle or 0), None if frame is None else int(frame), slot, grown)
            if room.run is not run or (room.cycle, room.frame, room.slot, room.cycles) != picture:
                room.run = run   # compared by identity: a trace is the instructor's own object, never copied
                room.cycle, room.frame, room.slot, room.cycles = picture
                room.version, room.drawn = room.version + 1, None
            room.touched = self._clock()
            return True

    def seen(self, code: str | None) -> Shown | None:
        """The room's picture now (the object itself: read it, do not change it), or None."""
        with self._lock:
            self._sweep()
            return self._rooms.get(str(code or "").upper())

    def drawn(self, room: Shown, draw: Callable[[Shown], tuple]) -> Shown:
        """The room's picture as it is now (a copy of `room`) with its view values, `draw(copy)`, drawn once per
        version: the first follower to ask draws them, those asking meanwhile wait and reuse them."""
        with room.drawing:
            with self._lock:
                shown = replace(room)
            if shown.drawn is None:
                shown.drawn = draw(shown)
                with self._lock:
                    if room.version == shown.version:   # else the room moved on while it was drawn
                        room.drawn = shown.drawn
            return shown

    def _sweep(self) -> None:
        """With the lock held: rooms untouched for `ttl_s` end."""
        now = self._clock()
        for code in [c for c, r in self._rooms.items() if now - r.touched > self.ttl_s]:
            del self._rooms[code]

    def __len__(self) -> int:
        with self._lock:
            return len(self._rooms)
