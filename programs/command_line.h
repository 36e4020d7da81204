// What every program's main does with its command line, said once: --help prints and exits
// 0; a bad flag is one line on stderr naming the program, then exit 2.
#pragma once

#include <iostream>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"

namespace kvc {

// Parses argv into `app`. The exit code when the program stops here (0 after help, 2 after a
// bad flag: "NAME: error: … (run NAME --help)"); nullopt when it goes on.
inline std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv,
                                           const std::string& name) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << name << ": error: " << e.what() << " (run " << name << " --help)\n";
    return 2;
  }
  return std::nullopt;
}

}  // namespace kvc
