/* The CRC-32 of a compiled engine module's source, which setup.py passes as a macro (BUILT_FROM in each
   module; fastlease._impl compares it with the source beside the module). Empty when built otherwise. */
#ifndef FASTLEASE_SOURCE_CRC
#define FASTLEASE_SOURCE_CRC ""
#endif
