"""Gemma-family decoders on the quantized KV cache: config, layers, decoder, generate, loaders."""

from kvjax.models.config import (DecoderConfig as DecoderConfig, gemma2_config as gemma2_config,
                                 gemma3_config as gemma3_config, llama_config as llama_config,
                                 default_config as default_config)
from kvjax.models.decoder import Decoder as Decoder
from kvjax.models.sampling import SamplingConfig as SamplingConfig, sample as sample
from kvjax.models.generation import (generate as generate, GenerateOutput as GenerateOutput,
                                   forward_uncached as forward_uncached)
from kvjax.models.loaders import (load_hf as load_hf, load_hf_safetensors as load_hf_safetensors,
                                  config_from_hf as config_from_hf,
                                  load_gemma_params as load_gemma_params, CheckpointError as CheckpointError)
