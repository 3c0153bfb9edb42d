"""Engine-plugin settings from ``TIERGATE_*`` environment variables.

vLLM builds the scheduler itself (``--scheduler-cls``), so the only channel for our options is the
environment of the engine process:

==============================  =====================================================  ============
variable                        meaning                                                default
==============================  =====================================================  ============
``TIERGATE_POLICY``             engine policy name (``priority.policies``)             ``slide``
``TIERGATE_PROFILE``            latency profile name or path to a profile JSON         per package
``TIERGATE_POLICY_PARAMS``      JSON object of the policy's parameters (its dataclass  ``{}``
                                in ``priority.policies``)
``TIERGATE_DEFAULT_TIER``       tier of requests that carry no tier                    ``default``
``TIERGATE_DEFAULT_WEIGHT``     weight of requests that carry neither weight nor       ``1.0``
                                ``priority``
``TIERGATE_DEFAULT_TTFT_MS``    TTFT SLO of requests without one (unset: 5x the        unset
                                prompt's zero-load TTFT, at least 200 ms)
``TIERGATE_DEFAULT_TPOT_MS``    TPOT SLO of requests without one                       ``100``
``TIERGATE_ESTIMATOR_THETA``    momentum of the step-time correction beta              ``0.8``
``TIERGATE_ESTIMATOR_WINDOW``   steps per beta update                                  ``16``
``TIERGATE_REFIT_EVERY``        steps between refits of the estimator's coefficients   ``64``
                                from real step times (0: beta only)
``TIERGATE_STEP_LOG``           CSV file each measured step is appended to (batch      unset
                                shape, predicted and real time): ``tiergate profile
                                from-steps`` builds a profile from it
==============================  =====================================================  ============

Every error names the variable and, for names, the known values, so a typo fails at start-up.
The ``DEFAULT_*`` variables fill :class:`~engine_common.protocol.BestEffortDefaults`, the defaults
of the gateway→engine protocol (re-exported here).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine_common.protocol import BestEffortDefaults
from priority.estimator import DEFAULT_THETA, DEFAULT_WINDOW
from priority.estimator_refit import DEFAULT_EVERY
from priority.policies import POLICY_NAMES, PolicyParamsError, SchedulingPolicy, policy_plugin
from priority.profiles import Profile, available_profiles, load_profile

__all__ = ["PREFIX", "BestEffortDefaults", "EngineSettings", "SettingsError"]

PREFIX = "TIERGATE_"


class SettingsError(ValueError):
    """An invalid ``TIERGATE_*`` variable (raised when the scheduler is constructed)."""


@dataclass(frozen=True, slots=True)
class EngineSettings:
    policy: str
    profile: Profile
    policy_params: Any = None
    """The policy's parameters dataclass, validated at start-up (None: the policy's defaults)."""
    defaults: BestEffortDefaults = field(default_factory=BestEffortDefaults)
    theta: float = DEFAULT_THETA
    window: int = DEFAULT_WINDOW
    refit_every: int = DEFAULT_EVERY
    """Steps between coefficient refits (:mod:`priority.estimator_refit`); 0 turns it off."""
    step_log: str | None = None
    """Where measured steps are appended as CSV (:mod:`engine_common.step_log`); None: nowhere."""

    def make_policy(self) -> SchedulingPolicy:
        """A fresh policy with its own estimator (beta starts at 1)."""
        estimator = self.profile.estimator(theta=self.theta, window=self.window)
        plugin = policy_plugin(self.policy)
        params = plugin.defaults if self.policy_params is None else self.policy_params
        return plugin.factory(estimator, params)

    @classmethod
    def from_env(cls, default_profile: str, env: Mapping[str, str] | None = None) -> EngineSettings:
        env = os.environ if env is None else env
        policy = env.get(f"{PREFIX}POLICY", "slide").strip()
        if policy not in POLICY_NAMES:
            raise SettingsError(
                f"{PREFIX}POLICY={policy!r} is not a policy; known: {', '.join(POLICY_NAMES)}"
            )
        plugin = policy_plugin(policy)
        if plugin.policy_type.uses_oracle_length:
            raise SettingsError(
                f"{PREFIX}POLICY={policy!r} needs true output lengths, which only exist in "
                "simulation"
            )
        profile_name = env.get(f"{PREFIX}PROFILE", default_profile).strip()
        try:
            profile = load_profile(profile_name)
        except (KeyError, ValueError, OSError) as exc:
            raise SettingsError(
                f"{PREFIX}PROFILE={profile_name!r}: {exc}; shipped profiles: "
                f"{', '.join(available_profiles())}"
            ) from None
        raw_params = env.get(f"{PREFIX}POLICY_PARAMS", "").strip() or "{}"
        try:
            params = json.loads(raw_params)
        except json.JSONDecodeError as exc:
            raise SettingsError(f"{PREFIX}POLICY_PARAMS is not JSON: {exc}") from None
        if not isinstance(params, dict):
            raise SettingsError(f"{PREFIX}POLICY_PARAMS must be a JSON object, got {raw_params}")
        try:  # unknown or invalid policy parameters fail here, at start-up
            policy_params = plugin.parse(params)
        except PolicyParamsError as exc:
            raise SettingsError(f"{PREFIX}POLICY_PARAMS for {policy!r}: {exc}") from None
        ttft_ms = _number(env, "DEFAULT_TTFT_MS", None)
        defaults = BestEffortDefaults(
            tier=env.get(f"{PREFIX}DEFAULT_TIER", "default").strip() or "default",
            weight=_positive(_number(env, "DEFAULT_WEIGHT", 1.0), "DEFAULT_WEIGHT"),
            ttft_s=None if ttft_ms is None else _positive(ttft_ms, "DEFAULT_TTFT_MS") / 1e3,
            tpot_s=_positive(_number(env, "DEFAULT_TPOT_MS", 100.0), "DEFAULT_TPOT_MS") / 1e3,
        )
        theta = _number(env, "ESTIMATOR_THETA", DEFAULT_THETA)
        window = _number(env, "ESTIMATOR_WINDOW", DEFAULT_WINDOW)
        if theta is None or not 0.0 <= theta < 1.0:
            raise SettingsError(f"{PREFIX}ESTIMATOR_THETA must be in [0, 1), got {theta}")
        if window is None or window < 1 or window != int(window):
            raise SettingsError(f"{PREFIX}ESTIMATOR_WINDOW must be an integer >= 1")
        refit_every = _number(env, "REFIT_EVERY", DEFAULT_EVERY)
        if refit_every is None or refit_every < 0 or refit_every != int(refit_every):
            raise SettingsError(f"{PREFIX}REFIT_EVERY must be an integer >= 0")
        step_log = env.get(f"{PREFIX}STEP_LOG", "").strip() or None
        return cls(
            policy, profile, policy_params, defaults, theta, int(window), int(refit_every), step_log
        )


def _number(env: Mapping[str, str], name: str, default: float | None) -> float | None:
    raw = env.get(PREFIX + name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{PREFIX}{name}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise SettingsError(f"{PREFIX}{name}={raw!r} is not finite")
    return value


def _positive(value: float | None, name: str) -> float:
    if value is None or value <= 0:
        raise SettingsError(f"{PREFIX}{name} must be > 0, got {value}")
    return value
