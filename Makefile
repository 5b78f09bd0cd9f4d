# The trained models, the recorded trace sets and the live-engine fidelity check, on CPU, with fixed seeds.
#
#   make recorded-traces        # record both trace sets from the shipped models/ (minutes)
#   make retrain                # retrain target and drafters from scratch into checkpoints/ (git-ignored),
#                               # then copy them into models/ with a card (about 1.5 h on 2 cores; -j2 runs
#                               # the two drafters in parallel)
#   make fidelity               # profile the live engine, run it (minutes), compare with the simulator
#
# Training stops at --steps or at the wall-clock cap (--max-minutes), whichever comes first, so on a
# faster or slower machine the weights (and hence the traces) differ; seeds fix data, init and sampling.

SPARKSIM ?= .venv/bin/sparksim
THREADS  ?= 1
CK       := checkpoints
TARGET   := tinylm-d128-l6
MODELS   := models/$(TARGET)
PYTHON   ?= .venv/bin/python
TRACES   := traces
GAMMA    := 7
TEMP     := 1.0
MAXNEW   := 512
DSTEPS   := 8000
DMINUTES := 55

.PHONY: recorded-traces retrain models fidelity live-profile drafter-data drafter-target drafter-dspark \
        drafter-dflash clean-drafter
.SECONDARY:  # keep the checkpoints and calibration files that pattern rules build

recorded-traces: $(TRACES)/$(TARGET)-dspark-recorded/card.yaml $(TRACES)/$(TARGET)-dflash-recorded/card.yaml

retrain: drafter-dspark drafter-dflash $(CK)/target/hf/config.json
	$(PYTHON) scripts/ship_models.py

models: $(MODELS)/card.yaml
$(MODELS)/card.yaml:
	@echo "models/ is missing: run make retrain" && false

drafter-data: $(CK)/data/train.jsonl
$(CK)/data/train.jsonl:
	$(SPARKSIM) build-prompts --out $(CK)/data --seed 0 --train-per-domain 600 --val-per-domain 40 --test-per-domain 300

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
	  --kind $* --gamma $(GAMMA) --layers 2 --markov-rank 64 --steps $(DSTEPS) --batch-size 8 --anchors 64 \
	  --lr 1e-3 --max-new-tokens $(MAXNEW) --temperature $(TEMP) --max-minutes $(DMINUTES) --seed 0 --threads $(THREADS)

$(CK)/%/drafter/calibration.json: $(CK)/%/drafter/drafter.safetensors
	$(SPARKSIM) calibrate --target $(CK)/target/model --drafter $(CK)/$*/drafter --prompts $(CK)/data/val.jsonl \
	  --temperature $(TEMP) --max-new-tokens $(MAXNEW) --seed 1 --threads $(THREADS)

$(TRACES)/$(TARGET)-%-recorded/card.yaml: $(MODELS)/card.yaml
	$(SPARKSIM) record --target $(MODELS)/target --drafter $(MODELS)/$* --prompts $(MODELS)/data/test.jsonl \
	  --gamma $(GAMMA) --temperature $(TEMP) --max-new-tokens $(MAXNEW) --seed 2 --threads $(THREADS) \
	  --note "Recorded by make recorded-traces from the shipped models: 300 responses per domain, at most $(MAXNEW) new tokens." \
	  --out $(TRACES)/$(TARGET)-$*-recorded

# The live engine's own profile, then the live runs (resumable: finished cells in
# analyses/data/live-fidelity/live-runs.csv are kept; delete it to measure them all again),
# then the comparison.
LIVE_PROFILE := profiles/cpu-tinylm-d128-live-measured
live-profile: $(LIVE_PROFILE)/card.yaml
$(LIVE_PROFILE)/card.yaml: $(MODELS)/card.yaml $(TRACES)/$(TARGET)-dspark-recorded/card.yaml
	$(SPARKSIM) profile live --target $(MODELS)/target --drafter $(MODELS)/dspark --rounds 3 --threads 1 \
	  --loop-traces $(TRACES)/$(TARGET)-dspark-recorded --out $(LIVE_PROFILE)

fidelity: $(LIVE_PROFILE)/card.yaml $(TRACES)/$(TARGET)-dspark-recorded/card.yaml
	$(PYTHON) analyses/fidelity.py --measure
	$(PYTHON) analyses/fidelity.py

drafter-dspark: $(CK)/dspark/drafter/calibration.json
drafter-dflash: $(CK)/dflash/drafter/calibration.json

clean-drafter:
	rm -rf $(CK)/data $(CK)/target $(CK)/dspark $(CK)/dflash
