"""A room that follows the instructor, live: the instructor opens a room and gets a short code; every page that
joins it (`?room=CODE`) shows the instructor's run at the instructor's cycle, phase and picked token, and can
step away and come back (its "follow" switch).

    Rooms()                          the server's rooms, one object per app (no module-level state)
    Rooms.open()                     a new room's code: five letters without look-alikes (no 0/O, 1/I/L)
    Rooms.host_key(code)             the secret the opening page keeps: it takes the room back after a reload
    Rooms.reclaim(code, key)         the room (its picture) for the page that holds its key, or None
    Rooms.show(code, run, ...)       the instructor's page shows this picture now: the room's next version
    Rooms.toured(code, stop)         the instructor's tour at stop `stop` (None: closed): followers' tours follow it
    Rooms.here(code)                 the instructor's page is still open (its beat): how many pages follow the room
    Rooms.away_s(room)               how long the instructor's page has not been heard (0 while it is)
    Rooms.seen(code)                 the room's picture (a `Shown`), or None for a room that is not (or no longer) there
    Rooms.followed(code, page, ...)  one follower page's room, pushed at each new version (an async iterator)
    Rooms.unfollow(code, page)       that page steps away: its `followed` ends
    Rooms.step_away(code, page)      that page moved its own picture: its `followed` tells where the room is instead
    Rooms.is_away(code, page)        whether it did (until it follows anew)
    await Rooms.drawn(room, draw)    the room's picture drawn once per version, for every follower

A follower's page holds one long-lived stream (`followed`) that is woken the moment the room moves: no page asks
the server a few times a second, and none waits for its next question to hear of a move. The figures come from the
instructor's RunTrace, shared read-only, so a follower does no model work, recorded run or live run alike (a live
run's trace grows while it is shown: a cycle once recorded never changes). The view values of a version are drawn
once, by the first follower woken, and handed to the others (`Shown.drawn`); those woken while it draws await the
same drawing (thirty woken at once would otherwise draw it side by side). A room its instructor has left (no
picture shown for `ttl_s`) ends by itself: its followers are told, once, and their streams end. The instructor's
open page beats every `here_every_s` (`here`): unheard for `away_after_s`, its followers are told it is away (at
their stream's next beat, within `alive_s`), and told again at once when it is back (defaults: `HERE_EVERY_S`,
`AWAY_S`, `ALIVE_S`).
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace

from eagleviz.trace import RunTrace

CODE_LETTERS = "ABCDEFGHJKMNPQRSTUVWXYZ"   # no I, L, O: read aloud and typed from a projector
CODE_CHARS = 5
ROOM_TTL_S = 2 * 3600                      # a room untouched this long (its instructor gone) ends
MAX_ROOMS = 256                            # a public server is not a room directory: the oldest go first
ALIVE_S = 20.0                             # a follower's stream says "nothing new" this often (see `followed`)
HERE_EVERY_S = 10.0                        # the instructor's open page says it is there this often (`here`)
AWAY_S = 25.0                              # unheard this long, the instructor's page is away (closed, asleep)


@dataclass
class Shown:
    """What a room shows: the instructor's run, cycle, phase frame (None: the end state) and picked slot, at
    `version` (one more at each change). `drawn`: the view values of this version, once a follower drew them;
    `drawing`: the drawing of this version under way, awaited by the followers woken meanwhile."""

    run: RunTrace | None = None
    cycle: int = 0
    frame: int | None = None
    slot: int | None = None
    cycles: int = 0          # the run's cycles when shown: a live run's growth is a change too
    tour: int | None = None  # the instructor's tour stop (None: its tour closed)
    version: int = 0
    touched: float = 0.0
    heard: float = 0.0       # when the instructor's page was last heard (a move or its beat)
    back: int = 0            # how often the instructor's page came back after being away (its followers told)
    key: str = field(default="", repr=False, compare=False)   # the instructor's secret (`Rooms.reclaim`)
    drawn: tuple | None = field(default=None, repr=False)
    drawing: asyncio.Future | None = field(default=None, repr=False, compare=False)


class Rooms:
    """The open rooms, by code. Thread-safe: the instructor's events arrive in Gradio's worker threads, the
    followers' streams in its event loop."""

    def __init__(self, ttl_s: float = ROOM_TTL_S, clock: Callable[[], float] = time.monotonic,
                 max_rooms: int = MAX_ROOMS, alive_s: float = ALIVE_S, here_every_s: float = HERE_EVERY_S,
                 away_after_s: float = AWAY_S):
        self.ttl_s, self._clock, self.max_rooms, self.alive_s = ttl_s, clock, max_rooms, alive_s
        self.here_every_s, self.away_after_s = here_every_s, away_after_s
        self._lock = threading.Lock()
        self._rooms: dict[str, Shown] = {}
        # The followers' streams asleep until their room changes, by room: each woken in its own event loop.
        self._asleep: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        self._streams: dict[tuple[str, str], int] = {}   # (room, page): the ticket of that page's newest stream
        self._away: set[tuple[str, str]] = set()   # (room, page): a follower that moved its own picture
        self._tickets = itertools.count()

    def open(self) -> str:
        """A new room (nothing shown yet): its code."""
        with self._lock:
            self._sweep()
            while len(self._rooms) >= self.max_rooms:
                self._end(min(self._rooms, key=lambda c: self._rooms[c].touched))
            code = self._new_code()
            now = self._clock()
            self._rooms[code] = Shown(touched=now, heard=now, key=secrets.token_urlsafe(16))
            return code

    def host_key(self, code: str | None) -> str | None:
        """The secret of room `code` that its instructor's page keeps (never shown to the class), or None."""
        with self._lock:
            room = self._rooms.get(_code(code))
            return None if room is None else room.key

    def reclaim(self, code: str | None, key: str | None) -> Shown | None:
        """The room, for a page that holds its key (the instructor's, reloaded or opened again): touched, as a move
        would; None for a wrong key or a room that has ended."""
        with self._lock:
            self._sweep()
            room = self._rooms.get(_code(code))
            if room is None or not key or not secrets.compare_digest(room.key, str(key)):
                return None
            room.touched = self._clock()
            self._heard(_code(code), room)
            return room

    def here(self, code: str | None) -> int | None:
        """The instructor's open page beats (every `HERE_EVERY_S`): it is there, though it may not move for a while.
        Returns how many pages follow the room now, or None when the room has ended. Does not touch the room: one
        open page does not keep a room alive past its `ttl_s` of no moves."""
        with self._lock:
            self._sweep()
            code = _code(code)
            room = self._rooms.get(code)
            if room is None:
                return None
            self._heard(code, room)
            return sum(1 for c, _ in self._streams if c == code)

    def away_s(self, room: Shown) -> float:
        """How long the instructor's page of `room` has gone unheard, or 0 while it is heard (within `away_after_s`)."""
        with self._lock:
            quiet = self._clock() - room.heard
        return quiet if quiet > self.away_after_s else 0.0

    def _heard(self, code: str, room: Shown) -> None:
        """With the lock held: the instructor's page of room `code` was heard; back after being away, its followers
        are woken to say so."""
        now = self._clock()
        if now - room.heard > self.away_after_s:
            room.back += 1
            self._wake(code)
        room.heard = now

    def _new_code(self) -> str:
        while True:
            code = "".join(secrets.choice(CODE_LETTERS) for _ in range(CODE_CHARS))
            if code not in self._rooms:
                return code

    def show(self, code: str | None, run: RunTrace | None, cycle: float | None, frame: float | None,
             slot: int | None) -> bool:
        """The instructor's page shows this picture: followers see it next. False when the room has ended."""
        grown = len(run.cycles) if run is not None else 0   # a live run's new cycles: its text and slider grow
        picture = (int(cycle or 0), None if frame is None else int(frame), slot, grown)

        def change(room: Shown) -> bool:
            if room.run is run and (room.cycle, room.frame, room.slot, room.cycles) == picture:
                return False
            room.run = run   # compared by identity: a trace is the instructor's own object, never copied
            room.cycle, room.frame, room.slot, room.cycles = picture
            return True

        return self._moved(code, change)

    def toured(self, code: str | None, stop: int | None) -> bool:
        """The instructor's tour is at stop `stop` (None: closed): followers see its words and its view next. False
        when the room has ended."""
        def change(room: Shown) -> bool:
            moved, room.tour = room.tour != stop, stop
            return moved

        return self._moved(code, change)

    def _moved(self, code: str | None, change: Callable[[Shown], bool]) -> bool:
        """The instructor's page moved: `change(room)` applies it (True where the room changed: a new version, its
        followers woken). The room is touched either way. False when the room has ended."""
        with self._lock:
            self._sweep()
            code = _code(code)
            room = self._rooms.get(code)
            if room is None:
                return False
            if change(room):
                room.version, room.drawn, room.drawing = room.version + 1, None, None
                self._wake(code)
            room.touched = self._clock()
            self._heard(code, room)
            return True

    def seen(self, code: str | None) -> Shown | None:
        """The room's picture now (the object itself: read it, do not change it), or None."""
        with self._lock:
            self._sweep()
            return self._rooms.get(_code(code))

    async def followed(self, code: str | None, page: str, alive_s: float | None = None) -> AsyncIterator[Shown | None]:
        """One follower page's room (`page`: its session), pushed: as it is now, then at each new version the moment
        it is shown, or when the instructor's page is back after being away; None once when the room has ended (or
        never was), and then no more. With nothing new for `alive_s`, the room again as it was: its reader may have
        left (a closed tab ends a Gradio stream at its next update only), and the instructor's page may be away.
        It stops when the page steps away (`unfollow`) or follows anew (its newer stream takes over). `alive_s`: the
        rooms' own unless given. Yields the room object itself: read it, do not change it."""
        code, loop = _code(code), asyncio.get_running_loop()
        alive_s = self.alive_s if alive_s is None else alive_s
        key, seen = (code, page), None
        with self._lock:
            ticket = self._streams[key] = next(self._tickets)
            self._away.discard(key)   # following anew: the picture again
            self._wake(code)   # the page's earlier stream, if any, ends
        try:
            while True:
                woken = asyncio.Event()
                with self._lock:
                    self._sweep()
                    if self._streams.get(key) != ticket:
                        return
                    room = self._rooms.get(code)
                    asleep = room is not None and (room.version, room.back, key in self._away) == seen
                    if asleep:
                        self._asleep.setdefault(code, []).append((loop, woken))
                if room is None:
                    yield None
                    return
                if not asleep:
                    with self._lock:
                        seen = (room.version, room.back, key in self._away)
                    yield room
                elif not await self._slept(code, loop, woken, alive_s):
                    seen = None   # nothing new for alive_s: the room again, as it is now
        finally:
            with self._lock:
                if self._streams.get(key) == ticket:
                    del self._streams[key]
                    self._away.discard(key)

    async def _slept(self, code: str, loop: asyncio.AbstractEventLoop, woken: asyncio.Event, alive_s: float) -> bool:
        """A stream asleep on room `code` until woken (True) or for `alive_s` (False)."""
        try:
            await asyncio.wait_for(woken.wait(), alive_s)
            return True
        except TimeoutError:
            return False
        finally:
            with self._lock:
                if (loop, woken) in self._asleep.get(code, ()):
                    self._asleep[code].remove((loop, woken))

    def unfollow(self, code: str | None, page: str) -> None:
        """Page `page` steps away from room `code`: its stream (`followed`) ends."""
        with self._lock:
            if self._streams.pop((_code(code), page), None) is not None:
                self._wake(_code(code))

    def step_away(self, code: str | None, page: str) -> bool:
        """Page `page`, following room `code`, moved its own picture (a step, the slider, a token): its stream
        stops pushing the room's picture and tells where the room is instead, at once and at each move, until the
        page follows anew. False where the page has no stream on the room."""
        key = (_code(code), page)
        with self._lock:
            if key not in self._streams:
                return False
            self._away.add(key)
            self._wake(key[0])
            return True

    def is_away(self, code: str | None, page: str) -> bool:
        with self._lock:
            return (_code(code), page) in self._away

    async def drawn(self, room: Shown, draw: Callable[[Shown], tuple]) -> Shown:
        """The room's picture as it is now (a copy of `room`) with its view values, `draw(copy)`, drawn once per
        version in a worker thread: the first follower to ask starts it, those asking meanwhile await the same."""
        with self._lock:
            shown = replace(room)
            if shown.drawn is None and room.drawing is None:
                room.drawing = asyncio.ensure_future(asyncio.to_thread(draw, shown))
            drawing = room.drawing
        if shown.drawn is None:
            try:   # shielded: a follower that leaves meanwhile does not cancel the others' picture
                shown.drawn = await asyncio.shield(drawing)
            except Exception:
                with self._lock:
                    room.drawing = None if room.drawing is drawing else room.drawing   # the next follower retries
                raise
            with self._lock:
                if room.version == shown.version:   # else the room moved on while it was drawn
                    room.drawn = shown.drawn
        return shown

    def _wake(self, code: str) -> None:
        """With the lock held: the streams asleep on room `code` look at it again."""
        for loop, woken in self._asleep.pop(code, ()):
            loop.call_soon_threadsafe(woken.set)

    def _end(self, code: str) -> None:
        """With the lock held: room `code` ends; its followers' streams say so."""
        del self._rooms[code]
        self._wake(code)

    def _sweep(self) -> None:
        """With the lock held: rooms untouched for `ttl_s` end."""
        now = self._clock()
        for code in [c for c, r in self._rooms.items() if now - r.touched > self.ttl_s]:
            self._end(code)

    def __len__(self) -> int:
        with self._lock:
            return len(self._rooms)


def _code(code: str | None) -> str:
    """A room's code as typed (any case, spaces around it) as the room's own."""
    return str(code or "").strip().upper()
