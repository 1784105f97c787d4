"""How far a trained refiner departs from its first stage: the weight chosen on training questions."""
import numpy as np
import pandas as pd

#: The weights tried by default, from the first stage (0) to the trained model (1).
DEPARTURE_GRID = (0., .25, .5, .75, 1.)


def checked_departure(value: float) -> float:
    """``value`` as a float, if it is a departure weight (in [0, 1]); else a ValueError naming it."""
    if not 0. <= value <= 1.:
        raise ValueError(f'departure must lie in [0, 1], got {value}')
    return float(value)


def choose_departure(scores: pd.DataFrame) -> float:
    """The smallest departure weight whose score is within one standard error of the best (the one-SE rule).

    A refiner that starts at its first stage (weight 0) and learns only the departure from it (weight 1) is run
    at a weight between. Held-out training questions score each weight; the best weight is kept only as far as
    the data can tell it from smaller ones: the smallest weight whose mean paired difference from the best is no
    worse than one standard error of that difference is chosen. The choice leans towards the first stage, which is
    what a collection the model never saw can rely on.

    Args:
        scores: One column per weight (its name the weight), one row per held-out question, e.g. MRecall@10.

    Returns:
        The chosen weight.
    """
    if scores.empty or scores.shape[1] == 0:
        raise ValueError('choose_departure needs at least one weight and one question')
    if scores.isna().any().any():
        raise ValueError('choose_departure: the scores hold NaN (a question without a score for every weight)')
    weights = sorted(float(w) for w in scores.columns)
    scores = scores.rename(columns=float)[weights]
    best = scores[scores.mean().idxmax()]   # the smallest weight among equal bests

    def within_one_error(weight: float) -> bool:
        difference = (scores[weight] - best).to_numpy()
        error = difference.std(ddof=1) / np.sqrt(len(difference)) if len(difference) > 1 else 0.
        return difference.mean() >= -error

    return next(weight for weight in weights if within_one_error(weight))   # the best itself always is
