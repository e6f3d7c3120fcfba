"""Which windows of block_size + 1 tokens make the next batch: the order in which the loader visits
a dataset's token files. Both orders are a small state (JSON-able) that can be saved and restored to
continue exactly."""

from typing import Any

import numpy as np

Window = tuple[int, int]  # (file index, first token)


class RandomWindows:
    """nanoGPT's order: each window at a uniformly random start in the whole split (with
    replacement), a file picked in proportion to the windows it holds. Each rank draws its own
    stream, fixed by (seed, rank)."""

    def __init__(self, file_tokens: list[int], block_size: int, seed: int, rank: int = 0):
        # starts per file
        starts = np.array([max(n - block_size, 0) for n in file_tokens], dtype=np.int64)
        self.starts, self.p = starts, starts / starts.sum()
        self.rng = np.random.Generator(np.random.PCG64([seed, rank]))

    def take(self, n: int) -> list[Window]:
        files = (
            self.rng.choice(len(self.starts), size=n, p=self.p)
            if len(self.starts) > 1
            else np.zeros(n, int)
        )
        firsts = self.rng.integers(0, self.starts[files])
        return list(zip(files.tolist(), firsts.tolist(), strict=True))

    def state_dict(self) -> dict[str, Any]:
        return {"order": "random", "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]

    def state_problem(self, state: dict[str, Any]) -> str | None:
        """Why state cannot be loaded, or None: any dataset can go on drawing from the saved
        generator."""
        try:
            np.random.PCG64().state = state["rng"]
        except (KeyError, TypeError, ValueError):
            return "the saved position is not one of this order's"
        return None


class EpochWindows:
    """Epochs over the split cut into consecutive windows (each window's last token is the next
    one's first), shuffled without replacement: every epoch a new order of the files and of the
    windows in each, fixed by (seed, epoch). The ranks share the order and take every world_size-th
    window, so they never read the same window in an epoch and together read each one once."""

    def __init__(
        self, file_tokens: list[int], block_size: int, seed: int, rank: int = 0, world_size: int = 1
    ):
        self.counts = [max(n - 1, 0) // block_size for n in file_tokens]
        self.block_size, self.seed, self.rank, self.world_size = block_size, seed, rank, world_size
        self.epoch, self.file_pos, self.pos = 0, 0, rank
        self._orders: dict[tuple[int, int], np.ndarray] = {}

    def file_order(self) -> np.ndarray:
        return np.random.Generator(np.random.PCG64([self.seed, self.epoch])).permutation(
            len(self.counts)
        )

    def window_order(self, file: int) -> np.ndarray:
        key = (self.epoch, file)
        # one file's order at a time: its windows, not the whole split's
        if key not in self._orders:
            rng = np.random.Generator(np.random.PCG64([self.seed, self.epoch, file]))
            self._orders = {key: rng.permutation(self.counts[file])}
        return self._orders[key]

    def take(self, n: int) -> list[Window]:
        windows = []
        files = self.file_order()
        while len(windows) < n:
            file = int(files[self.file_pos])
            if self.pos < self.counts[file]:
                windows.append((file, int(self.window_order(file)[self.pos]) * self.block_size))
                self.pos += self.world_size
                continue
            # on into the next file, keeping this rank's place in the stride
            self.pos -= self.counts[file]
            self.file_pos += 1
            # a new epoch, a new order; each rank starts at its own place
            if self.file_pos == len(files):
                self.epoch, self.file_pos, self.pos = self.epoch + 1, 0, self.rank
                files = self.file_order()
        return windows

    def state_dict(self) -> dict[str, Any]:
        place = {"epoch": self.epoch, "file_pos": self.file_pos, "pos": self.pos}
        # windows: what the place refers to
        return {"order": "epochs", **place, "windows": list(self.counts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.file_pos, self.pos = state["epoch"], state["file_pos"], state["pos"]

    def state_problem(self, state: dict[str, Any]) -> str | None:
        """Why state is no place in these epochs, or None: one saved over other files (or other
        sizes of them: the dataset changed, or block_size did) would name windows that are not there
        now."""
        place = [state.get(k) for k in ("epoch", "file_pos", "pos")]
        if not all(type(v) is int and v >= 0 for v in place) or place[1] >= len(self.counts):
            return "the saved position is not one of this order's"
        saved = state.get("windows", self.counts)  # not recorded before: trusted
        if saved != self.counts:
            return (
                f"its saved position counts {sum(saved):,} windows in {len(saved)} files, there "
                "are now " + (f"{sum(self.counts):,} in {len(self.counts)}")
            )
        return None


DATA_ORDERS = ("random", "epochs")


def window_order(
    order: str, file_tokens: list[int], block_size: int, seed: int, rank: int, world_size: int
):
    """The order named by the data_order setting (one of DATA_ORDERS)."""
    if order == "random":
        return RandomWindows(file_tokens, block_size, seed, rank)
    return EpochWindows(file_tokens, block_size, seed, rank, world_size)
