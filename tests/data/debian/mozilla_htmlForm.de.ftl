input-file-and-more-files =
    { $fileCount ->
        [one] und eine weitere
       *[other] und { $fileCount } weitere
    }
form-post-secure-to-insecure-warning-title = Sicherheitswarnung
form-post-secure-to-insecure-warning-message =
    Die eingegebenen Daten werden über eine nicht gesicherte Verbindung übertragen und könnten von einer dritten Person mitgelesen werden.
    
    Sollen diese Daten wirklich gesendet werden?
form-post-secure-to-insecure-warning-continue = Fortfahren
