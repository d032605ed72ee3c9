// Private: what the safetensors reader shares with the header validator.
#pragma once

#include <cstdint>
#include <string>

namespace grouplin {

// Throws Error(HeaderTooLarge) when a header length `n` passes kSafetensorsMaxHeaderSize;
// `context` starts the message ("loading \"x.safetensors\"").
void check_safetensors_header_length(uint64_t n, const std::string& context);

}  // namespace grouplin
