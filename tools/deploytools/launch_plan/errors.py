"""The one exception of the launch plan and its memory budget."""


class PlanError(ValueError):
    """A refusal: one sentence that names the variable to change and what to do."""
