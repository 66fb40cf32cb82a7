"""Running a model: loading (models, tiny), the fast decode engine, generation, scoring, hooks and
attention controls, interventions, embeddings, step-wise decoding, the compute precision (fp32 / bf16 autocast)."""
