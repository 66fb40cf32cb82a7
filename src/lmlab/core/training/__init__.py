"""Training pieces shared by methods: the pretraining loop, partial (top-block) fine-tuning, SFT, preference
losses and pairs, LoRA, rewards, PRMs, the LLM annotator."""
