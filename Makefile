# Rebuild the recorded trace sets from scratch, on CPU, with fixed seeds.
#
#   make recorded-traces        # about 1.5 h on a 2-core machine; checkpoints go under checkpoints/ (git-ignored)
#   make recorded-traces THREADS=4
#
# Training stops at --steps or at the wall-clock cap (--max-minutes), whichever comes first, so on a
# faster or slower machine the weights (and hence the traces) differ; seeds fix data, init and sampling.

SPARKSIM ?= .venv/bin/sparksim
THREADS  ?= 1
CK       := checkpoints
TARGET   := tinylm-d128-l6
TRACES   := traces
GAMMA    := 7
TEMP     := 1.0
MAXNEW   := 256

.PHONY: recorded-traces drafter-data drafter-target drafter-dspark drafter-dflash clean-drafter
.SECONDARY:  # keep the checkpoints and calibration files that pattern rules build

recorded-traces: $(TRACES)/$(TARGET)-dspark-recorded/card.yaml $(TRACES)/$(TARGET)-dflash-recorded/card.yaml \
                 $(CK)/target/hf/config.json

drafter-data: $(CK)/data/train.jsonl
$(CK)/data/train.jsonl:
	$(SPARKSIM) build-prompts --out $(CK)/data --seed 0 --train-per-domain 400 --val-per-domain 40 --test-per-domain 100

drafter-target: $(CK)/target/model/model.safetensors
$(CK)/target/model/model.safetensors: $(CK)/data/train.jsonl
	$(SPARKSIM) train-target --corpus $(CK)/data/corpus.jsonl --out $(CK)/target --d-model 128 --layers 6 \
	  --heads 2 --d-ff 384 --steps 2400 --batch-size 12 --seq-len 384 --lr 2e-3 --max-minutes 45 --seed 0 \
	  --threads $(THREADS)

# The same target as a HuggingFace Qwen3 checkpoint (loads with transformers; logits checked to match).
$(CK)/target/hf/config.json: $(CK)/target/model/model.safetensors
	$(SPARKSIM) export-target --target $(CK)/target/model --out $(CK)/target/hf

$(CK)/%/drafter/drafter.safetensors: $(CK)/target/model/model.safetensors
	$(SPARKSIM) train-drafter --target $(CK)/target/model --prompts $(CK)/data/train.jsonl --out $(CK)/$* \
	  --kind $* --gamma $(GAMMA) --layers 2 --markov-rank 64 --steps 2000 --batch-size 8 --anchors 64 \
	  --lr 1e-3 --max-new-tokens $(MAXNEW) --temperature $(TEMP) --max-minutes 15 --seed 0 --threads $(THREADS)

$(CK)/%/drafter/calibration.json: $(CK)/%/drafter/drafter.safetensors
	$(SPARKSIM) calibrate --target $(CK)/target/model --drafter $(CK)/$*/drafter --prompts $(CK)/data/val.jsonl \
	  --temperature $(TEMP) --max-new-tokens $(MAXNEW) --seed 1 --threads $(THREADS)

$(TRACES)/$(TARGET)-%-recorded/card.yaml: $(CK)/%/drafter/calibration.json
	$(SPARKSIM) record --target $(CK)/target/model --drafter $(CK)/$*/drafter --prompts $(CK)/data/test.jsonl \
	  --gamma $(GAMMA) --temperature $(TEMP) --max-new-tokens $(MAXNEW) --seed 2 --threads $(THREADS) \
	  --note "Rebuilt by make recorded-traces: 100 responses per domain, at most $(MAXNEW) new tokens." \
	  --out $(TRACES)/$(TARGET)-$*-recorded

drafter-dspark: $(CK)/dspark/drafter/calibration.json
drafter-dflash: $(CK)/dflash/drafter/calibration.json

clean-drafter:
	rm -rf $(CK)/data $(CK)/target $(CK)/dspark $(CK)/dflash
