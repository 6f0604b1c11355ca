"""NNERuntimeBasicCpu model format: layer values, byte codec, numpy reference evaluator."""
