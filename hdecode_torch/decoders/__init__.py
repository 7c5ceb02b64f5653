"""Decoders: heuristics of the literature, their registry, and DARTS calibration."""

from .base import Decoder
from .calibration import calibrate_darts
from .heuristics import (
    CRM, ArgmaxLeaf, ConfidenceThreshold, Darts, ExpectedInformation, HiE, InformationThreshold, Majority,
    Plurality, TopDown,
)
from .registry import OptimalDecoder, get_decoder, list_decoders
from .risk_control import LossSteps, RiskControl, RiskCoverage, ThresholdDescent

__all__ = [
    "Decoder", "get_decoder", "list_decoders", "calibrate_darts", "OptimalDecoder",
    "ArgmaxLeaf", "TopDown", "ConfidenceThreshold", "Majority", "Plurality", "Darts", "ExpectedInformation",
    "InformationThreshold", "HiE", "CRM", "ThresholdDescent", "RiskControl", "LossSteps", "RiskCoverage",
]
