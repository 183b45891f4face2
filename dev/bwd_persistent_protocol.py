#!/usr/bin/env python3
"""Host model of the persistent Hopper backward's synchronisation (src/cuda/sm90/bwd_kernel.h,
bwd_kv_kernel with BwdTraitsBody::kPersistent): one CTA's producer thread, two consumer warpgroups,
the dQ writer warp and the copy engine, as agents that run in random interleavings over random
tile sequences (tiles with 0, 1 or more steps, tiles past a varlen sequence's keys), with the
static rounds or the dynamic feed, the d64 or the d128 K release. It checks that every run ends
(no deadlock: a hang on the GPU), that no buffer is overwritten while it is read (stages, K, V,
the dS^T double buffer, the dQ parts, the feed's slots), that no named barrier gets a second
arrival of one agent in one generation nor ends half-arrived, and that every mbarrier ends with
no arrival or transaction pending.

mbarrier semantics as the PTX ISA's: wait(parity) passes once the phase of that parity has
completed (phase count & 1 != parity); a phase completes when its arrivals and its transaction
bytes are all in. Named barriers: a generation completes at its thread count.

    python3 dev/bwd_persistent_protocol.py [runs]

Self-check: MUTATION=tile_parity (dS^T buffer by the tile's step parity), no_v_empty, kv_phase_per_tile,
stage_per_tile or writer_rearm (the dQ writer's hand-back restarted per tile) must each fail
(2026-12-02: hazard, hazard, deadlock, hazard, hazard; the unmutated protocol passes 20000 runs).
The model encodes which product reads which buffer as the kernel's comments state (K read by
the dQ product at d128 and at d64's 128-row steps, not with K's halves: its "d64" mode is now the
softcap / ALiBi d64 kernel's); it checks the protocol, not the kernel's code.
"""
import os
import random
import sys

# Self-check of the model: a deliberately broken protocol must fail (MUTATION=name).
MUTATION = os.environ.get("MUTATION", "")


class Deadlock(Exception):
    pass


class Hazard(Exception):
    pass


class MBar:
    def __init__(self, name, count):
        self.name, self.count, self.pending, self.tx, self.phase = name, count, count, 0, 0

    def _check(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def arrive(self, n=1, tx=0):
        assert self.pending >= n, f"{self.name}: more arrivals than expected"
        self.tx += tx
        self.pending -= n
        self._check()

    def complete_tx(self, n):
        self.tx -= n
        assert self.tx >= 0, f"{self.name}: tx underflow"
        self._check()

    def passed(self, parity):
        return (self.phase & 1) != parity


class Named:
    def __init__(self, name, threads):
        self.name, self.threads, self.arrived, self.gen, self.who = name, threads, 0, 0, set()

    def arrive(self, agent, n):
        if agent in self.who:
            raise Hazard(f"named {self.name}: {agent} arrives twice in one generation")
        self.who.add(agent)
        self.arrived += n
        if self.arrived > self.threads:
            raise Hazard(f"named {self.name}: {self.arrived} arrivals of {self.threads}")
        g = self.gen
        if self.arrived == self.threads:
            self.gen += 1
            self.arrived = 0
            self.who = set()
        return g


def simulate(tiles, dynamic, d64, rng):
    """tiles: list of (exists, steps) in the CTA's order. Returns the scheduler's step count."""
    full = [MBar(f"full{s}", 1) for s in range(2)]
    empty = [MBar(f"empty{s}", 8) for s in range(2)]
    kv_full, k_empty, v_empty = MBar("kv_full", 1), MBar("k_empty", 8), MBar("v_empty", 8)
    feed_full = [MBar(f"feed_full{s}", 1) for s in range(2)]
    feed_empty = [MBar(f"feed_empty{s}", 9) for s in range(2)]
    ds_ready = Named("ds_ready", 256)
    dq_full = [Named(f"dq_full{c}", 160) for c in range(2)]
    dq_empty = [Named(f"dq_empty{c}", 160) for c in range(2)]
    readers = {}  # buffer -> set of agents reading it
    slot = [None, None]
    dma = []  # in-flight loads: (buffer, barrier, tx)
    terminal = len(tiles)

    def hold(buf, agent):
        readers.setdefault(buf, set()).add(agent)

    def drop(buf, agent):
        readers[buf].discard(agent)

    def write(buf, agent):
        others = readers.get(buf, set()) - {agent}
        if others:
            raise Hazard(f"{agent} writes {buf} while {sorted(others)} read it")

    # A blocked agent yields "blocked" and has changed nothing since its last yield (each wait
    # first yields as progress, after whatever the agent did before it); anything else is progress.
    def wait_mbar(bar, parity):
        yield
        while not bar.passed(parity):
            yield "blocked"

    def wait_named(bar, g):
        yield
        while bar.gen <= g:
            yield "blocked"

    def tile_of(t):
        return tiles[t] if t < terminal else None

    def producer():
        it = kv_it = 0
        r = 0
        while True:
            t = r if r < terminal else terminal
            if dynamic:
                s = r & 1
                yield from wait_mbar(feed_empty[s], ((r >> 1) & 1) ^ 1)
                write(f"slot{s}", "P")
                slot[s] = t
                feed_full[s].arrive()
            if t >= terminal:
                return
            exists, steps = tile_of(t)
            r += 1
            if not exists or steps == 0:
                continue
            for step in range(steps):
                s = it % 2
                if MUTATION == "stage_per_tile":
                    s = step % 2
                yield from wait_mbar(empty[s], ((it // 2) & 1) ^ 1)
                write(f"stage{s}", "P")
                full[s].arrive(1, tx=1)
                dma.append((f"stage{s}", full[s], 1))
                it += 1
                yield
                if step == 0:
                    phase = (kv_it & 1) ^ 1
                    kv_it += 1
                    if MUTATION != "no_v_empty":
                        yield from wait_mbar(v_empty, phase)
                    write("V", "P")
                    kv_full.arrive(1, tx=2)
                    dma.append(("V", kv_full, 1))
                    yield
                    yield from wait_mbar(k_empty, phase)
                    write("K", "P")
                    dma.append(("K", kv_full, 1))
                    yield

    def take(r, agent, weight):
        if not dynamic:
            return r if r < terminal else terminal
        s = r & 1
        yield from wait_mbar(feed_full[s], (r >> 1) & 1)
        hold(f"slot{s}", agent)
        t = slot[s]
        yield
        drop(f"slot{s}", agent)
        feed_empty[s].arrive(weight)
        return t

    def consumer(c):
        me = f"C{c}"
        it = kv_it = 0
        r = 0
        while True:
            t = yield from take(r, me, 4)
            r += 1
            if t >= terminal:
                return
            exists, steps = tile_of(t)
            if not exists:
                continue
            if steps > 0:
                yield from wait_mbar(kv_full, 0 if MUTATION == "kv_phase_per_tile" else kv_it & 1)
                kv_it += 1
                hold("K", me)
                hold("V", me)
                if d64:
                    write(f"Kh{c}", me)  # its own copy of K's half (read by its own dQ product)
            for step in range(steps):
                s = it % 2
                last = step + 1 == steps
                yield from wait_mbar(full[s], (it // 2) & 1)
                hold(f"stage{s}", me)
                yield  # S^T, dP^T, exponentials
                if last:
                    drop("V", me)
                    v_empty.arrive(4)
                    if d64:
                        drop("K", me)
                        k_empty.arrive(4)
                b = f"ds{(step if MUTATION == 'tile_parity' else it) & 1}"
                write(b, me)  # this consumer's dS^T rows
                yield
                g = ds_ready.arrive(me, 128)
                yield from wait_named(ds_ready, g)
                hold(b, me)  # dQ product reads both consumers' rows
                yield
                drop(b, me)  # dQ done (wait<1> after dK's issue)
                if last and not d64:
                    drop("K", me)
                    k_empty.arrive(4)
                g = dq_empty[c].arrive(me, 128)
                yield from wait_named(dq_empty[c], g)
                write(f"dq{c}", me)
                yield
                dq_full[c].arrive(me, 128)
                yield  # dK done
                drop(f"stage{s}", me)
                empty[s].arrive(4)
                it += 1
            yield  # dK/dV stores

    def writer():
        started = False
        r = 0
        while True:
            t = yield from take(r, "W", 1)
            r += 1
            if t >= terminal:
                break
            exists, steps = tile_of(t)
            if not exists:
                continue
            if MUTATION == "writer_rearm":
                started = False  # bwd_kv_kernel's per-CTA hand-back, restarted per tile
            for _ in range(steps):
                if not started:
                    for c in range(2):
                        dq_empty[c].arrive("W", 32)
                    started = True
                else:
                    for c in range(2):
                        yield  # wait_group.read
                        drop(f"dq{c}", "W")
                        dq_empty[c].arrive("W", 32)
                for c in range(2):
                    g = dq_full[c].arrive("W", 32)
                    yield from wait_named(dq_full[c], g)
                    hold(f"dq{c}", "W")
                    yield
        for c in range(2):
            drop(f"dq{c}", "W") if f"dq{c}" in readers else None

    agents = {"P": producer(), "C0": consumer(0), "C1": consumer(1), "W": writer()}
    ticks = 0
    while agents or dma:
        ticks += 1
        choices = list(agents) + (["dma"] if dma else [])
        name = rng.choice(choices)
        if name == "dma":
            buf, bar, tx = dma.pop(rng.randrange(len(dma)))
            bar.complete_tx(tx)
            continue
        try:
            if next(agents[name]) != "blocked":
                continue
        except StopIteration:
            del agents[name]
            continue
        # Deadlock: with no copy in flight, a round in which every agent stays blocked changes
        # nothing, so they stay blocked for ever.
        if not dma:
            blocked = True
            for n in list(agents):
                try:
                    if next(agents[n]) != "blocked":
                        blocked = False
                        break
                except StopIteration:
                    del agents[n]
                    blocked = False
                    break
            if blocked:
                raise Deadlock(f"agents {sorted(agents)} blocked, nothing in flight")
    for bar in full + empty + [kv_full, k_empty, v_empty] + feed_full + feed_empty:
        assert bar.pending == bar.count and bar.tx == 0, f"{bar.name} ends with {bar.pending} arrivals, {bar.tx} tx"
    for bar in [ds_ready] + dq_full + dq_empty:
        if bar.arrived != 0:
            raise Hazard(f"named {bar.name} ends half-arrived ({bar.arrived} of {bar.threads})")
    return ticks


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    rng = random.Random(20)
    for i in range(runs):
        n = rng.randint(0, 6)
        tiles = [(rng.random() > 0.15, rng.choice([0, 1, 1, 2, 3, 5])) for _ in range(n)]
        dynamic, d64 = rng.random() < 0.5, rng.random() < 0.5
        try:
            simulate(tiles, dynamic, d64, random.Random(i))
        except (Deadlock, Hazard, AssertionError) as e:
            print(f"run {i}: tiles {tiles} dynamic {dynamic} d64 {d64}: {type(e).__name__}: {e}")
            return 1
    print(f"{runs} runs: every run ended, no hazard, barriers clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
