"""Training pieces shared by methods: the pretraining loop, partial (top-block) fine-tuning, SFT, preference
losses and pairs, LoRA, rewards, PRMs, the LLM annotator, and the dev learning-rate search whose grid is extended
past an edge (`lr_search`)."""
