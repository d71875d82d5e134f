"""Engine adapters: rlpace's Scheduler inside verl, TRL and Trinity-RFT.

Each adapter is imported on its own, only when its engine is installed:

    from rlpace.adapters.verl import RlpaceDataset      # pip install 'rlpace[verl]'
    from rlpace.adapters.trl import RlpaceGRPOTrainer   # pip install 'rlpace[trl]'
    from rlpace.adapters.trinity import RlpaceSelector  # trinity-rft 0.6 (docs/engines.md)

Adapters translate engine objects (verl `DataProto`, TRL input dicts) into `Feedback`
records and drive a `Scheduler` through the engine's own hooks and checkpoint channel;
the scheduling itself is the core's (`rlpace.policies`). Config lines: docs/engines.md.
"""

__all__: list[str] = []
