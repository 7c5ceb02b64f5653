"""Decoders: the heuristics of the literature, the optimal decoder of any metric as a decoder, the
decoders' registry, and DARTS calibration."""

from .base import Decoder
from .calibration import calibrate_darts
from .heuristics import (
    CRM, ArgmaxLeaf, ConfidenceThreshold, Darts, ExpectedInformation, HiE, InformationThreshold, Majority,
    Plurality, TopDown,
)
from .registry import DECODERS, OptimalDecoder, decoder_class, get_decoder, list_decoders, register_decoder
from .risk_control import LossSteps, RiskControl, RiskCoverage, ThresholdDescent

__all__ = [
    "Decoder", "DECODERS", "get_decoder", "list_decoders", "decoder_class", "register_decoder", "calibrate_darts",
    "OptimalDecoder", "ArgmaxLeaf", "TopDown", "ConfidenceThreshold", "Majority", "Plurality", "Darts",
    "ExpectedInformation", "InformationThreshold", "HiE", "CRM", "ThresholdDescent", "RiskControl", "LossSteps",
    "RiskCoverage",
]
