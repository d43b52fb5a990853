"""The stop rules driven on a bare :class:`p2pnode.jobs.JobRunner` the way :class:`p2pnode.jobs._control.JobControl`
drives them (for runner tests without a whole node): stepped when the runner reports a start or an end and at the
rules' next deadline, memory samples fed as they arrive, each stop carried out by ``runner.stop`` with its rule."""

from __future__ import annotations

import trio

from p2pnode.jobs._stops import StopDriver


class RulesOnRunner:
    """``async with`` a nursery: ``nursery.start(RulesOnRunner(runner).run)``."""

    def __init__(self, runner) -> None:
        self.runner = runner
        self.driver = StopDriver(runner, self.execute)
        self.rules = self.driver.rules
        runner.on_sample = self.driver.sampled
        before = runner.on_change
        runner.on_change = lambda: (before() if before else None, self.news())
        self.stops: list = []
        self._wake = trio.Event()

    def execute(self, effects) -> None:
        for e in effects:
            self.stops.append(e)
            self.runner.stop(e.job_id, e.reason, e.rule)

    def news(self) -> None:
        self._wake.set()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            self._wake = trio.Event()
            self.driver.step(trio.current_time())
            with trio.move_on_at(self.driver.next_deadline()):
                await self._wake.wait()
