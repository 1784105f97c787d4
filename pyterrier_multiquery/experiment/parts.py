"""The finished parts of a long experiment kept on disk, so that a stopped run goes on where it stopped."""
import json
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from pyterrier_multiquery._files import building


class StoredParts:
    """Frames of each finished part of an experiment (a fold, a training source and a test collection, ...), one CSV
    file per kind beside the report (``{out}_{kind}.csv``), each replaced whole, through a temporary name, when a part
    is added. The settings that shape the parts (a seed, a fold count, a fingerprint of the code that computes them)
    are kept beside them (``{out}_settings.json``), and a run under other settings is refused rather than mixed in.

    Without ``out`` the parts are kept in memory only.
    """

    def __init__(self, out: Optional[Path], kinds: Sequence[str], settings: Optional[dict] = None,
                 restart: bool = False):
        """
        Args:
            out: The report's path without extension (None: in memory).
            kinds: The kinds of frame a part has.
            settings: The settings of the run that adds parts (None: the stored parts are only read).
            restart: Whether to forget the stored parts.

        Raises:
            SystemExit: If parts are stored under other settings than ``settings``, or without a record of theirs.
        """
        self.paths = {kind: out.with_name(f'{out.name}_{kind}.csv') for kind in kinds} if out else {}
        self.settings_path = out.with_name(out.name + '_settings.json') if out else None
        if restart and out:
            for path in [*self.paths.values(), self.settings_path]:
                path.unlink(missing_ok=True)
        self.frames = {kind: pd.read_csv(self.paths[kind], dtype={'qid': str})
                       if kind in self.paths and self.paths[kind].exists() else pd.DataFrame() for kind in kinds}
        stored = json.loads(self.settings_path.read_text()) if out and self.settings_path.exists() else None
        self.settings = stored if settings is None else settings
        if settings is not None and any(not frame.empty for frame in self.frames.values()) and stored != settings:
            if stored is None:
                made = f'no record of their settings ({self.settings_path.name} is missing)'
            else:
                differing = [name for name in dict.fromkeys([*settings, *stored])
                             if stored.get(name) != settings.get(name)]
                made = (', '.join(f'{name}={stored.get(name)!r}' for name in differing) +
                        f' (from {self.settings_path.name}), not ' +
                        ', '.join(f'{name}={settings.get(name)!r}' for name in differing))
            raise SystemExit(f'the parts stored beside {out} were made with {made}: run with those settings (and '
                             'that code), give another --out, or --restart')

    def rows(self, kind: str, **key) -> pd.DataFrame:
        """The stored rows of ``kind`` whose columns equal ``key``."""
        frame = self.frames[kind]
        if frame.empty:
            return frame
        match = pd.Series(True, index=frame.index)
        for column, value in key.items():
            match &= frame[column] == value
        return frame[match].reset_index(drop=True)

    def done(self, kind: str, **key) -> bool:
        """Whether rows of ``kind`` are stored for the part ``key``."""
        return not self.rows(kind, **key).empty

    def add(self, **frames: pd.DataFrame) -> None:
        """Stores frames of a finished part, by kind (a part's last kind is to be added last: it marks it done)."""
        # the first part records the settings, also over a record no part was stored under (a run stopped between
        # the two writes): else a later run under other settings would be recorded under the old ones
        if self.settings_path is not None and all(frame.empty for frame in self.frames.values()):
            with building(self.settings_path) as tmp:
                tmp.write_text(json.dumps(self.settings))
        for kind, frame in frames.items():
            self.frames[kind] = pd.concat([self.frames[kind], frame], ignore_index=True)
            if kind in self.paths:
                with building(self.paths[kind]) as tmp:
                    self.frames[kind].to_csv(tmp, index=False)
