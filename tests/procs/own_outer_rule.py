"""A user's own outer rule for the centre tie (``--tie-outer own_outer_rule:half_steps``, this
folder on PYTHONPATH): the anchor moves half the members' mean move each round, and each
training centre becomes the anchor (as DiLoCo's does); `not_a_rule` gives what is no rule."""


class HalfSteps:
    """anchor += mean_moved / 2; the centres become the anchor."""

    moves_centres = False

    def step(self, anchor, velocity, mean_moved):
        anchor += 0.5 * mean_moved

    def move_centre(self, centre, snapshot, anchor):
        raise AssertionError("the centres become the anchor")

    def describe(self):
        return "own rule: half steps"


def half_steps(tie):
    return HalfSteps()


def not_a_rule(tie):
    return object()
