// Private: the text of a parser's own exception, fit to go into a GroupLin message.
//
//   } catch (const nlohmann::json::exception& e) {
//     throw Error(ErrorCode::InvalidIndex, "not JSON (" + detail::parser_text(e.what()) + ")");
//   }
//
// nlohmann::json's messages repeat the input's last token ("last read: '...'") with only C0
// controls spelled out: DEL, C1 controls and direction overrides from a hostile file would reach
// the terminal as they are. Every reader that includes a parser's text goes through this one
// function, which escapes by grouplin::escaped's rule.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace grouplin::detail {

// Bytes of parser text kept: the position and the start of the token, not a 100 MB string.
inline constexpr size_t kMaxParserText = 200;

// `what` cut after kMaxParserText bytes on a character boundary ("..." marks the cut), then
// escaped as grouplin::escaped does.
std::string parser_text(std::string_view what);

}  // namespace grouplin::detail
